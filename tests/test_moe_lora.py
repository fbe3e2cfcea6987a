"""LoRA on a mixture-of-experts policy: adapters on attention, experts and routers frozen, refused by name."""
import asyncio

import pytest
import torch

from slick.train.trainer import Trainer
from tests.test_lora import advantages, nudge_b
from tests.test_moe_engine import spiky_moe
from tests.test_moe_train import PROMPTS, engine_samples
from tests.test_train import make_cfg, simple_loss
from tests.batches import batch_of


def test_lora_on_a_mixtral_adapts_attention_and_syncs_to_the_engine(mixtral_dir):
    from slick.engine.local import LocalEngine
    from slick.weights.check import check_engine_weights
    from slick.weights.sync import sync_weights

    d = mixtral_dir
    samples = engine_samples(d, PROMPTS[:2], n=2, max_new=6)
    tr = Trainer(make_cfg(d, lora_rank=4, lr=1e-2, use_routing_replay=True))
    adapted = {n.split(".lora_")[0].rsplit(".", 1)[-1] for n in tr.param_names}
    assert adapted == {"q_proj", "k_proj", "v_proj", "o_proj"}          # all-linear: attention only
    frozen = {n: p.detach().clone() for n, p in tr.model.named_parameters() if not p.requires_grad}
    assert any("experts" in n for n in frozen) and any(n.endswith("gate.weight") for n in frozen)
    nudge_b(tr, seed=1, std=0.2)
    before = tr.compute_logprobs(samples)
    m = tr.train_step(batch_of(samples, advantages(samples)), simple_loss)
    assert m["moe/replay_missing_samples"] == 0
    assert all(torch.equal(frozen[n], p) for n, p in tr.model.named_parameters() if n in frozen)   # bit for bit
    after = tr.compute_logprobs(samples)
    assert max(float((a - b).abs().max()) for a, b in zip(after, before)) > 1e-3   # the adapters moved the policy

    async def go():
        eng = LocalEngine(d, dtype="fp32", device="cpu", threaded=False)

        async def compute(s):
            return tr.compute_logprobs(s)
        try:
            await sync_weights(tr, [eng], "colocated")             # merged attention + the untouched experts
            return await check_engine_weights(tr, eng, 1e-3, compute)
        finally:
            await eng.close()
    assert asyncio.run(go())["perf/weight_check_max_abs_diff"] <= 1e-3


@pytest.fixture(scope="module")
def mixtral_dir(tmp_path_factory):
    return spiky_moe(tmp_path_factory.mktemp("moe_lora"), "mixtral")[0]


@pytest.mark.parametrize("target, named", [("w1", "w1"), ("experts", "experts"), ("gate", "gate"),
                                           ("q_proj,gate_up_proj", "gate_up_proj")])
def test_lora_targets_on_experts_or_routers_are_refused_by_name(mixtral_dir, target, named):
    with pytest.raises(ValueError) as e:
        Trainer(make_cfg(mixtral_dir, lora_rank=4, lora_target_modules=target))
    msg = str(e.value)
    assert f"{named!r}" in msg and "mixture-of-experts" in msg and "q_proj" in msg, msg
