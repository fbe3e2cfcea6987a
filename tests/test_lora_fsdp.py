"""LoRA (PEFT) on 2 FSDP2 trainer ranks on a real local Ray cluster (gloo): one step equals the in-process LoRA
trainer's, the base stays bitwise unchanged, the engines get merged weights, checkpoints are PEFT adapters that
resume in one process, and a short run passes the weight check after every sync."""
import asyncio

import pytest
import torch
from safetensors.torch import load_file

from slick.cluster import start_cluster
from slick.factory.trainer import make_trainer
from slick.loop.sync import train
from slick.train.fsdp_lora import peft_key
from slick.train.trainer import Trainer
from tests.test_cluster_ray import _wait_gone, make_cfg as ray_cfg, read_jsonl
from tests.test_loop import learnable_task
from tests.test_train import make_cfg, make_samples, simple_loss
from tests.batches import batch_of

LR = 1e-3


def make_adapter(model_dir, out):
    """A PEFT adapter (rank 4, all-linear) with non-zero B, so A gets gradients from the first step."""
    from peft import LoraConfig, get_peft_model
    from transformers import AutoModelForCausalLM

    torch.manual_seed(5)
    hf = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32)
    peft = get_peft_model(hf, LoraConfig(r=4, lora_alpha=8.0, target_modules="all-linear", task_type="CAUSAL_LM"))
    with torch.no_grad():
        for n, p in peft.named_parameters():
            if ".lora_B." in n:
                p.normal_(0.0, 0.05)
    peft.save_pretrained(str(out))
    return str(out)


def advantages(samples):
    g = torch.Generator().manual_seed(1)
    return [torch.randn(len(s.response_ids), generator=g) for s in samples]


def _frozen_shards(rank_actor):
    """This rank's local shards of every frozen (base) parameter."""
    return {n: p.to_local().detach().clone() for n, p in rank_actor.trainer.model.named_parameters()
            if not p.requires_grad}


def _base_weights(model_dir):
    return load_file(str(model_dir / "model.safetensors"))


def test_one_step_on_two_ranks_equals_the_in_process_lora_step(tiny_model_dir, tmp_path):
    import ray

    adapter = make_adapter(tiny_model_dir, tmp_path / "adapter")
    over = dict(lora_load=adapter, lr=LR, micro_batch_size=2, use_kl_loss=True, kl_loss_coef=0.1)
    samples, adv = make_samples(7), advantages(make_samples(7))
    one = Trainer(make_cfg(tiny_model_dir, **over))
    want_ref = one.compute_logprobs(samples, "ref")
    want_m = one.train_step(batch_of(samples, adv), simple_loss)
    want_w = dict(one.named_weights())
    want_p = one.adapter_payload()
    want_a = {peft_key(n): p.detach() for n, p in one.model.named_parameters() if p.requires_grad}

    cfg = make_cfg(tiny_model_dir, actor_num_gpus_per_node=2, dist_timeout=120.0, ray_start_timeout=120.0, **over)
    cluster = start_cluster(cfg)
    group = None
    try:
        group = make_trainer(cfg, cluster)
        assert group.world_size == 2
        ref = group.compute_logprobs(samples, "ref")
        m = group.train_step(batch_of(samples, adv), simple_loss)
        merged = dict(group.named_weights())
        payload = group.adapter_payload()       # what each rank sends alone to its colocated engine
        group.save(tmp_path / "ck")
        shards = ray.get([a.__ray_call__.remote(_frozen_shards) for a in group.actors])
        group.load(tmp_path / "ck")               # every rank takes its shard of the gathered checkpoint back
        reloaded = dict(group.named_weights())
    finally:
        if group is not None:
            group.close()
        cluster.stop()
    _wait_gone(group.pids, "trainer rank actors")

    # the KL reference is the base (adapters disabled) on both; the loss and the global gradient norm agree
    assert all(torch.allclose(a, b, atol=1e-5, rtol=0) for a, b in zip(ref, want_ref))
    assert m["loss"] == pytest.approx(want_m["loss"], rel=1e-5) and m["grad_norm"] == pytest.approx(
        want_m["grad_norm"], rel=1e-5)
    assert m["grad_norm"] > 0.1 and group.version == one.version == 1
    # the checkpoint is PEFT's adapter, gathered on rank 0: the same adapters as one process's step, within rounding
    got_a = load_file(str(tmp_path / "ck" / "adapter" / "adapter_model.safetensors"))
    assert set(got_a) == set(want_a) and len(got_a) == 28        # 2 layers x 7 linear layers x (A, B)
    before = load_file(str(tmp_path / "adapter" / "adapter_model.safetensors"))
    for k, w in want_a.items():
        assert float((got_a[k] - w).abs().max()) <= 1e-5, k
    moved = max(float((want_a[k] - before[k]).abs().max()) for k in want_a if ".lora_A." in k)
    assert moved > 0.5 * LR                                          # A moved too (B was not zero)
    # the adapter alone, gathered on the ranks: PEFT's config and tensors, the same as one process's
    assert payload.config == want_p.config and set(payload.tensors) == set(want_p.tensors) == set(want_a)
    assert payload.nbytes == want_p.nbytes == sum(t.numel() * 4 for t in want_a.values())
    for k, w in want_p.tensors.items():
        assert float((payload.tensors[k] - w).abs().max()) <= 1e-5, k
    # the engines' weights: the adapters merged into the base, the same as one process's
    assert set(merged) == set(want_w)
    for n, w in want_w.items():
        assert float((merged[n] - w).abs().max()) <= 1e-5, n
        assert torch.equal(reloaded[n], merged[n]), n
    # the base is bitwise what was loaded: each rank's shards of every frozen weight, put back together
    base = _base_weights(tiny_model_dir)
    for n, part in shards[0].items():
        whole = torch.cat([part, shards[1][n]])
        key = n.replace(".base_layer.", ".")
        assert torch.equal(whole, base[key]), n
    # the 2 ranks' checkpoint resumes in one process: the same adapters, version and optimizer state
    resumed = Trainer(make_cfg(tiny_model_dir, **over))
    resumed.load(tmp_path / "ck")
    assert resumed.version == 1 and len(resumed.optimizer.state) == 28
    for n, p in resumed.model.named_parameters():
        if p.requires_grad:
            assert torch.equal(p.detach(), got_a[peft_key(n)]), n


def test_a_short_lora_run_on_two_colocated_ranks_passes_every_weight_check(tmp_path, monkeypatch):
    """2 ranks, each with its engine: each rank sends its engine the adapter alone after every step (merged there
    into the base), and the check (versions and a
    probe's logprobs against the ranks', fp32 bound 1e-3) passes; the checkpoint holds the adapter only."""
    model, prompts = learnable_task(tmp_path, monkeypatch)
    cfg = ray_cfg(model, prompts, tmp_path / "run", lora_rank=4, lr=1e-2, num_rollout=2, n_samples_per_prompt=4,
                  colocate=True, save=str(tmp_path / "ck"), save_interval=2)
    run = asyncio.run(asyncio.wait_for(train(cfg), 400))
    trainer = run.train_parts.trainer
    assert run.processes.cluster is None and trainer.world_size == 2 and trainer.version == 2
    _wait_gone(run.train_parts.trainer.pids, "trainer rank actors")
    rows = read_jsonl(tmp_path / "run" / "metrics.jsonl")
    assert [r["step"] for r in rows] == [1, 2]
    checks = [r["perf/weight_check_max_abs_diff"] for r in rows]
    assert len(checks) == 2 and max(checks) <= 1e-3
    step = tmp_path / "ck" / "step_000002"
    assert (step / "adapter" / "adapter_model.safetensors").is_file() and not (step / "model").exists()
    assert not (step / "dcp").exists()

