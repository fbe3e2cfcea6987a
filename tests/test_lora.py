"""LoRA through PEFT (slick/train/lora.py): adapter-only training, the base as KL reference, merged weights and
PEFT's own step and merge, checkpoints, export, the weight check after a sync, refusals by name."""
import asyncio
import json

import pytest
import torch

from slick.config import Config
from slick.config.config import ConfigError
from slick.configure.validate import validate_config
from slick.models.adapter_check import ADAPTER
from slick.train.trainer import Trainer
from slick.types import Sample
from tests.test_train import make_cfg, make_samples, simple_loss
from tests.batches import batch_of


def lora_cfg(model_dir, **kw):
    return make_cfg(model_dir, **{"lora_rank": 4, "lr": 1e-2, **kw})


def advantages(samples, sign=1.0):
    return [torch.full((len(s.response_ids),), sign) for s in samples]


def adapter_tensors(tr):
    return {n: p.detach().clone() for n, p in tr.model.named_parameters() if p.requires_grad}


def nudge_b(tr, seed=0, std=0.05):
    """Give the zero-initialised B matrices values, so the adapter changes the forward from the first step."""
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for n, p in tr.model.named_parameters():
            if ".lora_B." in n:
                p.copy_(torch.randn(p.shape, generator=g) * std)


@pytest.fixture(scope="module")
def samples():
    return make_samples(6)


# ---------------------------------------------------------------------------------------------- training
def test_only_adapters_train_and_zero_b_is_the_base(tiny_model_dir, samples):
    plain = Trainer(make_cfg(tiny_model_dir, disable_fused_layers=True))   # the base, HF layers, no adapters
    tr = Trainer(lora_cfg(tiny_model_dir, use_kl_loss=True, kl_loss_coef=0.1))
    assert tr.ref_model is None                       # no second model: the reference is the adapter disabled
    assert tr.param_names and all(".lora_A." in n or ".lora_B." in n for n in tr.param_names)
    assert all(p.dtype == torch.float32 for p in tr.params)
    assert {id(p) for g in tr.optimizer.param_groups for p in g["params"]} == {id(p) for p in tr.params}
    base = plain.compute_logprobs(samples)
    for got in (tr.compute_logprobs(samples), tr.compute_logprobs(samples, "ref")):   # B = 0: exactly the base
        assert all(torch.equal(a, b) for a, b in zip(got, base))
    frozen = {n: p.detach().clone() for n, p in tr.model.named_parameters() if not p.requires_grad}
    for _ in range(2):
        tr.train_step(batch_of(samples, advantages(samples)), simple_loss)
    assert tr.version == 2
    assert all(torch.equal(frozen[n], p) for n, p in tr.model.named_parameters() if n in frozen)   # bit for bit
    after = tr.compute_logprobs(samples)
    assert max(float((a - b).abs().max()) for a, b in zip(after, base)) > 1e-3       # the adapters moved
    assert all(torch.equal(a, b) for a, b in zip(tr.compute_logprobs(samples, "ref"), base))   # reference did not


def _peft_step(model_dir, adapter_state, samples, lr):
    """One step of PEFT's own model: plain HF forward of each sequence, the same loss, torch's AdamW."""
    from peft import LoraConfig, get_peft_model, set_peft_model_state_dict
    from transformers import AutoModelForCausalLM

    hf = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32)
    peft = get_peft_model(hf, LoraConfig(r=4, lora_alpha=8.0, target_modules="all-linear", task_type="CAUSAL_LM"))
    set_peft_model_state_dict(peft, adapter_state)
    params = [p for p in peft.parameters() if p.requires_grad]
    opt = torch.optim.AdamW(params, lr=lr, betas=(0.9, 0.999), weight_decay=0.0)
    loss = 0.0
    for s in samples:
        ids = torch.tensor([s.prompt_ids + s.response_ids])
        lp = torch.log_softmax(peft(input_ids=ids).logits[0].float(), -1)
        P, tgt = len(s.prompt_ids), torch.tensor(s.response_ids)
        loss = loss - lp[P - 1:P - 1 + len(tgt)].gather(-1, tgt[:, None]).sum() / len(samples)
    loss.backward()
    opt.step()
    return float(loss.detach()), {n: p.detach() for n, p in peft.named_parameters() if p.requires_grad}


def test_one_step_equals_peft_own_step(tiny_model_dir, samples):
    tr = Trainer(lora_cfg(tiny_model_dir, lr=1e-2))
    nudge_b(tr)
    state = {k: v.clone() for k, v in tr.lora.adapter_state_dict().items()}
    m = tr.train_step(batch_of(samples, advantages(samples)), simple_loss)
    loss, theirs = _peft_step(tiny_model_dir, state, samples, 1e-2)
    assert m["loss"] == pytest.approx(loss, rel=1e-5)
    ours = adapter_tensors(tr)
    names = [n for n in theirs]
    assert len(names) == len(ours) == 28
    # Adam's first step is lr x g / (|g| + eps) per element: lr x sign(g) wherever |g| is well above eps. The two
    # forwards (packed vs one sequence each) differ by roundings, which that normalisation amplifies only where a
    # gradient is tiny. So: within 2e-5 (0.2% of the step) wherever PEFT's step is a full lr (>= 99% of it), within
    # 2 lr everywhere, and such clear elements are most of the adapter (not a vacuous check)
    lr = 1e-2
    for n in names:   # PEFT's names carry the PeftModel prefix "base_model.model."
        mine, before = ours[n.removeprefix("base_model.model.")], state[n.replace(".default", "")]
        clear = (theirs[n] - before).abs() >= 0.99 * lr
        assert float(clear.float().mean()) > 0.9, n
        assert float((mine - theirs[n])[clear].abs().max()) <= 2e-5, n
        assert float((mine - theirs[n]).abs().max()) <= 2 * lr, n
        assert float((mine - before).abs().max()) > 5e-3   # and the step moved it


def test_merged_weights_equal_peft_merge_and_unload(tiny_model_dir, samples):
    from peft import LoraConfig, get_peft_model, set_peft_model_state_dict
    from transformers import AutoModelForCausalLM

    tr = Trainer(lora_cfg(tiny_model_dir))
    nudge_b(tr, seed=3)
    tr.train_step(batch_of(samples, advantages(samples)), simple_loss)
    hf = AutoModelForCausalLM.from_pretrained(tiny_model_dir, dtype=torch.float32)
    peft = get_peft_model(hf, LoraConfig(r=4, lora_alpha=8.0, target_modules="all-linear", task_type="CAUSAL_LM"))
    set_peft_model_state_dict(peft, tr.lora.adapter_state_dict())
    want = dict(peft.merge_and_unload().named_parameters())
    got = dict(tr.named_weights())
    assert set(got) == set(want)
    for n in want:
        assert torch.allclose(got[n], want[n], atol=1e-7, rtol=0), n
    assert any(not torch.equal(got[n], p) for n, p in
               AutoModelForCausalLM.from_pretrained(tiny_model_dir, dtype=torch.float32).named_parameters())


# ---------------------------------------------------------------------------------------------- checkpoints
def test_resume_is_exact_and_checkpoint_is_small(tiny_model_dir, samples, tmp_path):
    a = Trainer(lora_cfg(tiny_model_dir))
    nudge_b(a)
    a.train_step(batch_of(samples, advantages(samples)), simple_loss)
    a.save(tmp_path / "ck")
    files = sorted(p.name for p in (tmp_path / "ck").iterdir())
    assert "adapter" in files and "model" not in files
    assert {"adapter_config.json", "adapter_model.safetensors"} <= {p.name for p in (tmp_path / "ck/adapter").iterdir()}
    b = Trainer(lora_cfg(tiny_model_dir))
    b.load(tmp_path / "ck")
    assert b.version == 1
    for t in (a, b):
        t.train_step(batch_of(samples, advantages(samples, -1.0)), simple_loss)
    wa, wb = adapter_tensors(a), adapter_tensors(b)
    assert all(torch.equal(wa[n], wb[n]) for n in wa)
    assert all(torch.equal(x, y) for x, y in zip(a.compute_logprobs(samples), b.compute_logprobs(samples)))
    full = Trainer(make_cfg(tiny_model_dir))
    with pytest.raises(ValueError, match="LoRA checkpoint cannot resume a full fine-tuning run"):
        full.load(tmp_path / "ck")


def test_export_merged_and_adapter(tiny_model_dir, samples, tmp_path):
    from peft import PeftModel
    from transformers import AutoModelForCausalLM

    from slick.ckpt.checkpoint import save_checkpoint
    from slick.ckpt.export import main as export_main

    tr = Trainer(lora_cfg(tiny_model_dir))
    nudge_b(tr, seed=5)
    tr.train_step(batch_of(samples, advantages(samples)), simple_loss)
    save_checkpoint(tmp_path / "ckpt", 1, tr, {"step": 1})
    assert export_main([str(tmp_path / "ckpt"), str(tmp_path / "merged")]) == 0
    assert export_main([str(tmp_path / "ckpt"), str(tmp_path / "adapter"), "--lora-adapter"]) == 0
    ids = torch.tensor([samples[0].prompt_ids + samples[0].response_ids])
    with torch.no_grad(), tr.lora.mode():
        want = tr.model(input_ids=ids).logits
        merged = AutoModelForCausalLM.from_pretrained(tmp_path / "merged", dtype=torch.float32)
        assert torch.allclose(merged(input_ids=ids).logits, want, atol=1e-5, rtol=0)
        base = AutoModelForCausalLM.from_pretrained(tiny_model_dir, dtype=torch.float32)
        again = PeftModel.from_pretrained(base, tmp_path / "adapter")
        assert torch.equal(again(input_ids=ids).logits, want)
    save_hf = tmp_path / "save_hf"
    tr.save_hf_files(save_hf)   # --save-hf: the merged weights from the trainer
    with torch.no_grad():
        assert torch.allclose(AutoModelForCausalLM.from_pretrained(save_hf)(input_ids=ids).logits, want, atol=1e-5)
    assert export_main([str(tmp_path / "ckpt"), str(tmp_path / "ckpt" / "inside")]) == 2   # output-dir rules


def test_lora_load_starts_from_an_adapter(tiny_model_dir, samples, tmp_path):
    a = Trainer(lora_cfg(tiny_model_dir))
    nudge_b(a, seed=9)
    a.lora.save_adapter(tmp_path / "ad")
    b = Trainer(make_cfg(tiny_model_dir, lora_load=str(tmp_path / "ad"), lr=1e-2))
    assert b.lora.spec.rank == 4 and b.lora.spec.alpha == 8.0
    assert all(torch.equal(x, y) for x, y in zip(a.compute_logprobs(samples), b.compute_logprobs(samples)))
    assert b.params and all(p.requires_grad for p in b.params)
    b.train_step(batch_of(samples, advantages(samples)), simple_loss)
    assert b.version == 1


# ---------------------------------------------------------------------------------------------- weight sync
def test_sync_lands_and_a_dropped_update_is_detected(tiny_model_dir, samples):
    from slick.engine.local import LocalEngine
    from slick.weights.check import WeightSyncError, check_engine_weights
    from slick.weights.sync import sync_weights

    tr = Trainer(lora_cfg(tiny_model_dir, lr=5e-2))
    nudge_b(tr, seed=1, std=0.2)
    for _ in range(2):
        tr.train_step(batch_of(samples, advantages(samples)), simple_loss)
    base = Trainer(make_cfg(tiny_model_dir))

    async def go():
        eng = LocalEngine(tiny_model_dir, dtype="fp32", device="cpu", threaded=False)

        async def compute(s):
            return tr.compute_logprobs(s)
        try:
            await sync_weights(tr, [eng], "colocated")
            ok = await check_engine_weights(tr, eng, 1e-3, compute)
            # a dropped adapter: the engine gets the base weights under the trainer's version
            await sync_weights(base.named_weights(), [eng], "colocated", version=tr.version)
            with pytest.raises(WeightSyncError, match="differ from the trainer's"):
                await check_engine_weights(tr, eng, 1e-3, compute)
            await sync_weights(tr.named_weights(), [eng], "colocated", version=tr.version - 1)
            with pytest.raises(WeightSyncError, match="reports version 1"):
                await check_engine_weights(tr, eng, 1e-3, compute)
            return ok
        finally:
            await eng.close()
    ok = asyncio.run(go())
    assert ok["perf/weight_check_max_abs_diff"] <= 1e-3


# ---------------------------------------------------------------------------------------------- refusals
def _problems(model_dir, **kw):
    base = dict(hf_checkpoint=str(model_dir), prompt_data=None, rm_type="exact", dtype="fp32")
    base.update(kw)
    with pytest.raises(ConfigError) as e:
        validate_config(Config.from_flat(base), check_files=True)
    return "\n".join(e.value.problems)


def test_refusals_by_name(tiny_model_dir, tmp_path):
    out = _problems(tiny_model_dir, lora_rank=4, lora_target_modules="q_proj,qkv_proj")
    assert "'qkv_proj' matches no linear layer" in out and "down_proj, gate_proj, k_proj" in out
    assert "'q_proj'" not in out
    out = _problems(tiny_model_dir, lora_rank=64)   # k_proj of the tiny model is 64 -> 32
    assert "--lora-rank 64 is larger than layer" in out and "out 32" in out
    out = _problems(tiny_model_dir, lora_rank=4, recompute_mlp=True, ref_load=str(tiny_model_dir),
                    actor_num_gpus_per_node=2)
    assert "--recompute-mlp" in out and "--ref-load with LoRA" in out and "trainer ranks" not in out   # FSDP2: fine
    assert "--train-precision bf16 with LoRA" in _problems(tiny_model_dir, lora_rank=4, dtype="bf16",
                                                          train_precision="bf16")
    assert "--lora-alpha without --lora-rank" in _problems(tiny_model_dir, lora_alpha=16.0)
    assert "not a PEFT adapter directory" in _problems(tiny_model_dir, lora_load=str(tmp_path))
    (tmp_path / "adapter_config.json").write_text(json.dumps(
        {"peft_type": "LORA", "r": 8, "lora_alpha": 16, "target_modules": ["q_proj", "v_proj"]}))
    out = _problems(tiny_model_dir, lora_load=str(tmp_path), lora_rank=4, lora_target_modules="q_proj")
    assert "--lora-rank 4 but the --lora-load adapter has rank 8" in out
    assert "--lora-target-modules q_proj but the --lora-load adapter targets q_proj, v_proj" in out


def test_trainer_refuses_unknown_targets_without_validation(tiny_model_dir):
    cfg = Config.from_flat(dict(hf_checkpoint=str(tiny_model_dir), dtype="fp32", device="cpu", lora_rank=2,
                                lora_target_modules="c_attn"))
    with pytest.raises(ValueError, match="'c_attn' matches no linear layer"):
        Trainer(cfg)
    assert ADAPTER == "default"


def test_weight_check_bound_by_precision_and_flag():
    """The check's default bound: off without LoRA, 1e-3 in fp32, 0.5 in bf16 (a healthy bf16 LoRA run measured
    probe gaps up to 0.16, docs/lora.md); --weight-check-tol wins, and turns the check on for full fine-tuning."""
    from slick.weights.check import check_tolerance

    full = Config.from_flat({})
    lora = Config.from_flat({"lora_rank": 8})
    assert check_tolerance(full, torch.bfloat16) is None
    assert check_tolerance(lora, torch.float32) == 1e-3
    assert check_tolerance(lora, torch.bfloat16) == 0.5
    assert check_tolerance(Config.from_flat({"lora_rank": 8, "weight_check_tol": 0.02}), torch.bfloat16) == 0.02
    assert check_tolerance(Config.from_flat({"weight_check_tol": 0.3}), torch.float32) == 0.3
