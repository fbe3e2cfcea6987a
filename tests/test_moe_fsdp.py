"""A mixture-of-experts policy on FSDP2 ranks (real gloo group): two ranks with routing replay equal one process."""
import pytest
import torch

from slick.algo.routing import decode_routing
from tests.test_moe_engine import spiky_moe
from tests.test_moe_train import PROMPTS, engine_samples
from tests.test_train_fsdp import cfg_for, one_step, run_ranks

# Adam's first step moves a weight by lr * g / (|g| + eps): where a gradient is near eps, the order of fp32 sums
# (two ranks' halves vs one pass) shows at a few percent of lr (1e-3)
W_BOUND = 5e-5
BOUND = 5e-5   # fp32, summation order only, on logprobs down to -13: max |two ranks' logprob - one process's|


def _cfg(model_dir):
    from tests.test_train import make_cfg

    base = cfg_for(model_dir)
    return make_cfg(model_dir, lr=base.lr, micro_batch_size=2, clip_grad=1.0, entropy_coef=0.01, use_kl_loss=True,
                    kl_loss_coef=0.1, kl_loss_type="low_var_kl", eps_clip=0.2, use_routing_replay=True)


def _rank_step(rank, world, model_dir, samples):
    from slick.train.trainer import Trainer

    cfg = _cfg(model_dir)
    tr = Trainer(cfg)
    out = one_step(tr, cfg, samples)
    out["fsdp"] = (tr.fsdp, tr.rank, tr.world_size, tr.moe is not None)
    return out


@pytest.mark.slow
def test_two_ranks_with_routing_replay_equal_one_process(tmp_path):
    from slick.train.trainer import Trainer

    d, _ = spiky_moe(tmp_path, "mixtral")
    samples = engine_samples(d, PROMPTS, n=2, max_new=6)          # 6 samples, shared prompts, engine routing
    assert all(decode_routing(s.routed_experts) is not None for s in samples)
    ranks = run_ranks(_rank_step, 2, (str(d), samples), tmp_path)
    cfg = _cfg(d)
    want = one_step(Trainer(cfg), cfg, samples)

    assert [r["fsdp"] for r in ranks] == [(True, 0, 2, True), (True, 1, 2, True)]
    for r in ranks:
        for key in ("lps", "ref", "after"):
            for a, b in zip(r[key], want[key]):
                assert a.shape == b.shape and float((a - b).abs().max()) <= BOUND, (key, float((a - b).abs().max()))
    m, w = ranks[0]["metrics"], want["metrics"]
    assert ranks[1]["metrics"] == m      # one dict on every rank (each rank routes other tokens: MoE stats reduced)
    for k in ("loss", "pg_loss", "grad_norm"):
        assert m[k] == pytest.approx(w[k], rel=1e-5, abs=1e-7), k
    # routing statistics are means over micro-batches: over both ranks' (the same on each), not rank 0's alone;
    # one MoE layer per decoder layer (2) plus the averages and the missing-record count
    assert sorted(k for k in m if k.startswith("moe/")) == sorted(k for k in w if k.startswith("moe/"))
    assert m["moe/replay_missing_samples"] == w["moe/replay_missing_samples"] == 0
    assert m["moe/mismatch"] == w["moe/mismatch"] == 0.0       # fp32: the trainer's router agrees with the engine's
    for n, t in want["weights"].items():                     # experts and routers included
        for r in ranks:
            err = float((r["weights"][n] - t).abs().max())
            assert err <= W_BOUND, (n, err)
    moved = {n for n, w0 in Trainer(cfg).named_weights()
             if float((want["weights"][n] - w0).abs().max()) > 1e-6}
    assert any("experts" in n for n in moved) and any("gate" in n and "experts" not in n for n in moved), moved
