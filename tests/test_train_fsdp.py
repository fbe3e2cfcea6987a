"""Data-parallel trainer ranks (FSDP2 over real gloo process groups): N ranks == one process, rank failures.

Ranks are real processes (``multiprocessing`` spawn) joined in a real gloo group on 127.0.0.1 with a free
port; every test joins or kills them before it returns. ``run_ranks`` is shared with test_checkpoint_dcp.py.
"""
import functools
import os
import random
import socket
import time
import traceback
from pathlib import Path

import pytest
import torch

from slick.proc import dist as D
from slick.types import Sample
from tests.test_train import make_cfg
from tests.batches import batch_of

PG_TIMEOUT_S = 30.0


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _entry(rank, world, port, fn, args, out_dir, timeout_s):
    os.environ.update(HF_HUB_OFFLINE="1", TRANSFORMERS_OFFLINE="1")
    torch.set_num_threads(1)
    out = Path(out_dir) / f"rank{rank}.pt"
    try:
        D.init_process_group("gloo", rank, world, "127.0.0.1", port, timeout_s)
        res = {"ok": fn(rank, world, *args)}
    except BaseException as e:  # the parent asserts on it
        res = {"error": f"{type(e).__name__}: {e}", "traceback": traceback.format_exc()}
    try:
        torch.save(res, out)
    finally:
        D.destroy()


def run_ranks(fn, world, args, tmp_path, timeout_s=PG_TIMEOUT_S, deadline_s=240.0, expect_ok=True):
    """Run ``fn(rank, world, *args)`` on ``world`` spawned gloo ranks; return each rank's result dict
    (``{"ok": value}`` or ``{"error": msg, "traceback": ...}``; None when the rank wrote nothing).
    Ranks still alive at ``deadline_s`` are killed and the test fails naming them."""
    import multiprocessing as mp

    out = Path(tmp_path) / f"ranks-{time.monotonic_ns()}"
    out.mkdir(parents=True)
    ctx = mp.get_context("spawn")
    port = free_port()
    procs = [ctx.Process(target=_entry, args=(r, world, port, fn, args, str(out), timeout_s), daemon=True)
             for r in range(world)]
    for p in procs:
        p.start()
    end = time.monotonic() + deadline_s
    for p in procs:
        p.join(max(0.0, end - time.monotonic()))
    alive = [r for r, p in enumerate(procs) if p.is_alive()]
    for p in procs:
        if p.is_alive():
            p.kill()
            p.join(10)
    assert not alive, f"ranks {alive} of {world} still running after {deadline_s}s (killed)"
    results = []
    for r in range(world):
        f = out / f"rank{r}.pt"
        results.append(torch.load(f, weights_only=False) if f.is_file() else None)
    if expect_ok:
        for r, res in enumerate(results):
            assert res is not None and "ok" in res, f"rank {r}: {res and res.get('traceback')}"
        return [res["ok"] for res in results]
    return results


# ---------------------------------------------------------------- split_for_ranks (pure)
def test_split_for_ranks_contiguous_balanced_deterministic():
    assert D.split_for_ranks([5, 1, 1, 1, 1, 1], 2) == [[0], [1, 2, 3, 4, 5]]
    assert D.split_for_ranks([3, 3, 3, 3], 2) == [[0, 1], [2, 3]]
    assert D.split_for_ranks([4, 1, 1, 4, 2, 2, 2], 3) == [[0, 1, 2], [3, 4], [5, 6]]
    assert D.split_for_ranks([1, 2, 3], 1) == [[0, 1, 2]]
    # fewer samples than ranks: one each, the rest empty
    assert D.split_for_ranks([7, 9], 4) == [[0], [1], [], []]
    assert D.split_for_ranks([], 2) == [[], []]
    # every rank gets one when n >= world, even with zero-cost samples
    assert D.split_for_ranks([0, 0, 0, 10], 3) == [[0, 1], [2], [3]]
    rng = random.Random(0)
    for _ in range(200):
        n, w = rng.randint(0, 30), rng.randint(1, 6)
        lengths = [rng.randint(0, 50) for _ in range(n)]
        parts = D.split_for_ranks(lengths, w)
        assert len(parts) == w and [i for p in parts for i in p] == list(range(n))
        if n >= w:
            assert all(parts)
        # optimal: no contiguous split into w runs has a smaller largest run
        best = _best_max_run(lengths, w)
        assert max((sum(lengths[i] for i in p) for p in parts), default=0) == best
    with pytest.raises(ValueError, match="world_size"):
        D.split_for_ranks([1], 0)


def _best_max_run(lengths, w):
    n = len(lengths)

    @functools.lru_cache(None)
    def f(i, k):  # smallest largest-run for lengths[i:] in at most k runs
        if i == n:
            return 0
        if k == 0:
            return float("inf")
        return min(max(sum(lengths[i:j]), f(j, k - 1)) for j in range(i + 1, n + 1))
    return f(0, w)


def test_world_outside_a_group():
    assert D.world() == (0, 1) and not D.is_distributed()
    D.destroy()   # no-op
    with pytest.raises(ValueError, match="rank 2 is outside 0..1"):
        D.init_process_group("gloo", 2, 2, "127.0.0.1", 1, 5)
    with pytest.raises(ValueError, match="unknown torch.distributed backend 'mpi'"):
        D.init_process_group("mpi", 0, 1, "127.0.0.1", 1, 5)


# ---------------------------------------------------------------- N ranks == one process
def batch():
    """7 samples: shared prompts (3 + 2), distinct lengths, a loss mask with zeros, one empty response."""
    rng = random.Random(11)
    prompts = [[rng.randrange(3, 900) for _ in range(k)] for k in (5, 3, 8, 2)]
    spec = [(0, 4), (0, 6), (0, 2), (1, 5), (1, 3), (2, 20), (3, 0)]
    out = []
    for i, (p, r) in enumerate(spec):
        resp = [rng.randrange(3, 900) for _ in range(r)]
        mask = [1] * r
        if r >= 3:
            mask[1] = 0
        out.append(Sample(index=i, group_index=p, prompt_ids=list(prompts[p]), response_ids=resp, loss_mask=mask,
                          rollout_logprobs=[-7.0] * r))
    return out


def cfg_for(model_dir):
    return make_cfg(model_dir, lr=1e-3, micro_batch_size=2, clip_grad=1.0, entropy_coef=0.01,
                    use_kl_loss=True, kl_loss_coef=0.1, kl_loss_type="low_var_kl", eps_clip=0.2)


def one_step(tr, cfg, samples):
    """compute_logprobs (actor, ref), one PPO-clip train_step with KL and entropy, then the new weights."""
    from slick.algo import AlgoParams
    from slick.algo.objective import compute_policy_objective

    g = torch.Generator().manual_seed(3)
    adv = [torch.randn(len(s.response_ids), generator=g) for s in samples]
    lps = tr.compute_logprobs(samples)
    ref = tr.compute_logprobs(samples, which="ref")
    old = [lp + 0.3 * torch.randn(lp.shape, generator=g) for lp in lps]
    ref_used = [r - 0.2 * torch.rand(r.shape, generator=g) for r in ref]   # the ref model equals the actor here
    loss_fn = functools.partial(compute_policy_objective, AlgoParams.from_config(cfg))
    m = tr.train_step(batch_of(samples, adv, old_logprobs=old, ref_logprobs=ref_used), loss_fn)
    weights = {n: w.clone() for n, w in tr.named_weights()}
    return {"lps": lps, "ref": ref, "metrics": m, "weights": weights, "after": tr.compute_logprobs(samples),
            "version": tr.version}


def _rank_one_step(rank, world, model_dir):
    from torch.distributed.tensor import DTensor

    from slick.train.trainer import Trainer

    cfg = cfg_for(model_dir)
    tr = Trainer(cfg)
    head = tr.model.get_output_embeddings().weight
    out = one_step(tr, cfg, batch())
    # outside the root's forward the root-owned lm head stays sharded (the root forward unshards it)
    out["head"] = (isinstance(head, DTensor), tuple(head.to_local().shape), tuple(head.shape))
    out["fsdp"] = (tr.fsdp, tr.rank, tr.world_size)
    return out


def packed_tokens(samples, world, micro_batch_size):
    """Packed input tokens of the per-rank plan (what the 'tokens' metric counts)."""
    from slick.train.packing import pack, pack_shared_prompts, seq_tokens, shares_prompts, split_micro_batches

    total, counts = 0, []
    for share in D.split_for_ranks([seq_tokens(s) for s in samples], world):
        sub = [samples[i] for i in share]
        mbs = split_micro_batches(sub, micro_batch_size)
        counts.append(len(mbs))
        for idx in mbs:
            total += (pack_shared_prompts if shares_prompts(sub, idx) else pack)(sub, idx).num_tokens
    return total, counts


@pytest.mark.slow
def test_two_ranks_equal_one_process(tiny_model_dir, tmp_path):
    from slick.train.trainer import Trainer

    samples = batch()
    total, counts = packed_tokens(samples, 2, 2)
    assert counts == [2, 1]            # rank 1 runs one zero-contribution padding pass
    ranks = run_ranks(_rank_one_step, 2, (str(tiny_model_dir),), tmp_path)
    cfg = cfg_for(tiny_model_dir)
    want = one_step(Trainer(cfg), cfg, samples)

    assert [r["fsdp"] for r in ranks] == [(True, 0, 2), (True, 1, 2)]
    full = ranks[0]["head"][2]
    assert ranks[0]["head"] == (True, (full[0] // 2, full[1]), full)
    for r in ranks:
        for key in ("lps", "ref", "after"):
            assert len(r[key]) == len(samples)
            for a, b in zip(r[key], want[key]):
                assert a.shape == b.shape and torch.allclose(a, b, atol=1e-5, rtol=0), key
    assert ranks[0]["metrics"] == ranks[1]["metrics"]        # the same dict on every rank, timings included
    m, w = ranks[0]["metrics"], want["metrics"]
    for k in ("loss", "pg_loss", "pg_clipfrac", "ppo_kl", "kl_loss", "entropy_loss", "grad_norm",
              "train_rollout_logprob_abs_diff"):
        assert m[k] == pytest.approx(w[k], rel=1e-5, abs=1e-7), k
    assert m["pg_clipfrac"] > 0 and m["kl_loss"] != 0 and m["grad_norm"] > 1.0   # clipping was exercised
    assert m["response_tokens"] == w["response_tokens"] == sum(sum(s.loss_mask) for s in samples)
    assert m["tokens"] == total and m["nonfinite_losses"] == 0 and m["skipped_steps"] == 0
    assert m["lr"] == w["lr"] and ranks[0]["version"] == ranks[1]["version"] == want["version"] == 1
    for n, t in want["weights"].items():
        for r in ranks:
            assert r["weights"][n].shape == t.shape
            err = float((r["weights"][n] - t).abs().max())
            assert err <= 1e-5, (n, err)           # fp32: summation order only
    moved = max(float((want["weights"][n] - w0).abs().max())
                for n, w0 in Trainer(cfg).named_weights())
    assert moved > 1e-4                              # the step really moved the weights


def step_then_none(tr, cfg, samples):
    """:func:`one_step`, then a train_step on no sample (every gradient zero: slick.loop.step leaves them all out)."""
    from slick.algo import AlgoParams
    from slick.algo.objective import compute_policy_objective

    first = one_step(tr, cfg, samples)["weights"]
    m = tr.train_step(batch_of([], []), functools.partial(compute_policy_objective, AlgoParams.from_config(cfg)))
    return {"first": first, "metrics": m, "weights": {n: w.clone() for n, w in tr.named_weights()},
            "version": tr.version}


def _rank_step_then_none(rank, world, model_dir):
    from slick.train.trainer import Trainer

    cfg = cfg_for(model_dir)
    return step_then_none(Trainer(cfg), cfg, batch())


@pytest.mark.slow
def test_a_step_on_no_sample_steps_every_rank_on_a_zero_gradient(tiny_model_dir, tmp_path):
    """Every rank runs the same one-token zero backward (FSDP's collectives match) and AdamW steps on a zero
    gradient: its moments carry the first step on, as in one process."""
    from slick.train.trainer import Trainer

    ranks = run_ranks(_rank_step_then_none, 2, (str(tiny_model_dir),), tmp_path)
    cfg = cfg_for(tiny_model_dir)
    want = step_then_none(Trainer(cfg), cfg, batch())
    for r in [want] + ranks:
        m = r["metrics"]
        assert (m["grad_norm"], m["tokens"], m["loss"], m["skipped_steps"], r["version"]) == (0.0, 0.0, 0.0, 0.0, 2)
        for n, t in want["weights"].items():   # fp32 summation order, carried through two AdamW steps
            assert float((r["weights"][n] - t).abs().max()) <= 3e-5, n
        # the second step moved every rank's weights (AdamW's moments, not the zero gradient), well past that
        assert max(float((r["weights"][n] - r["first"][n]).abs().max()) for n in want["weights"]) > 5e-4


# ---------------------------------------------------------------- faults
def _rank_fault(rank, world, model_dir, mode):
    from slick.train.trainer import Trainer

    tr = Trainer(cfg_for(model_dir))
    if rank == 1:
        if mode == "dies":
            os._exit(3)
        time.sleep(PG_TIMEOUT_FAULT + 8)   # "hangs": never joins the collective, exits after rank 0 gave up
        return "late"
    t0 = time.monotonic()
    try:
        tr.compute_logprobs(batch())
    except D.RankError as e:
        return {"error": str(e), "elapsed": time.monotonic() - t0}
    return {"error": None, "elapsed": time.monotonic() - t0}


PG_TIMEOUT_FAULT = 6.0


@pytest.mark.slow
@pytest.mark.parametrize("mode", ["dies", "hangs"])
def test_dead_or_hung_rank_fails_within_timeout_naming_the_rank(tiny_model_dir, tmp_path, mode):
    res = run_ranks(_rank_fault, 2, (str(tiny_model_dir), mode), tmp_path, timeout_s=PG_TIMEOUT_FAULT,
                    deadline_s=120, expect_ok=False)
    r0 = res[0]
    assert r0 is not None and "ok" in r0, r0
    err, elapsed = r0["ok"]["error"], r0["ok"]["elapsed"]
    assert err is not None and "trainer rank 0 of 2" in err and "compute_logprobs('actor')" in err, err
    assert elapsed < PG_TIMEOUT_FAULT + 5, elapsed
    if mode == "hangs":
        assert res[1] == {"ok": "late"}
    else:
        assert res[1] is None             # it died without writing a result


def _rank_bf16(rank, world, model_dir):
    from slick.train.trainer import Trainer

    out = {}
    for scheme in ("bf16", "autocast"):
        cfg = cfg_for(model_dir)
        cfg.dtype = "bf16"
        out[scheme] = one_step(Trainer(cfg, precision=scheme), cfg, batch())
    return out


@pytest.mark.slow
def test_two_ranks_bf16_schemes_match_one_process_within_bf16_rounding(tiny_model_dir, tmp_path):
    """``bf16`` = MixedPrecisionPolicy(bf16 params, fp32 reduce); ``autocast`` = fp32 shards under autocast."""
    from slick.train.trainer import Trainer

    ranks = run_ranks(_rank_bf16, 2, (str(tiny_model_dir),), tmp_path)
    for scheme in ("bf16", "autocast"):
        cfg = cfg_for(tiny_model_dir)
        cfg.dtype = "bf16"
        want = one_step(Trainer(cfg, precision=scheme), cfg, batch())
        got = ranks[0][scheme]
        assert got["metrics"] == ranks[1][scheme]["metrics"]
        for k in ("loss", "kl_loss", "pg_clipfrac", "grad_norm"):
            assert got["metrics"][k] == pytest.approx(want["metrics"][k], rel=1e-5), (scheme, k)
        for a, b in zip(got["lps"], want["lps"]):
            assert torch.allclose(a, b, atol=1e-5, rtol=0), scheme
        for n, t in want["weights"].items():
            w = got["weights"][n]
            assert w.dtype == t.dtype == (torch.bfloat16 if scheme == "bf16" else torch.float32), (scheme, n)
            d = (w.float() - t.float()).abs()
            if scheme == "bf16":
                # measured: at most one bf16 ulp apart (<= 4.9e-4 here), and more than 1e-4 apart on <= 8% of
                # the entries (gradient summation order before the bf16 rounding of the updated weights)
                ulp = torch.finfo(torch.bfloat16).eps * torch.maximum(t.float().abs(), w.float().abs())
                bad = d > ulp + 1e-5        # + the fp32 tolerance: masters near zero
                assert not bool(bad.any()), (n, d[bad][:5], t[bad][:5], w[bad][:5])
                assert float((d > 1e-4).float().mean()) < 0.15, n
            else:
                assert float(d.max()) <= 1e-5, (n, float(d.max()))


# ---------------------------------------------------------------- bf16 AdamW moments
def _low_moment_steps(tr, samples):
    """Two steps of the simple loss with bf16 AdamW moments: the weights after each, and the moments' types."""
    from tests.test_train import simple_loss

    adv = [torch.ones(len(s.response_ids)) for s in samples]
    out = {"w0": {n: w.clone() for n, w in tr.named_weights()}}
    for k in ("w1", "w2"):
        tr.train_step(batch_of(samples, adv), simple_loss)
        out[k] = {n: w.clone() for n, w in tr.named_weights()}
    st = next(iter(tr.optimizer.state.values()))
    out["moments"] = [(type(st[k]).__name__, str(st[k].dtype)) for k in ("exp_avg", "exp_avg_sq")]
    return out


def _rank_low_moments(rank, world, model_dir):
    from slick.train.trainer import Trainer

    tr = Trainer(make_cfg(model_dir, lr=1e-3, micro_batch_size=2, exp_avg_dtype="bf16", exp_avg_sq_dtype="bf16"))
    return _low_moment_steps(tr, batch())


def test_two_ranks_bf16_moments_update_their_shards(tiny_model_dir, tmp_path):
    from slick.train.trainer import Trainer

    ranks = run_ranks(_rank_low_moments, 2, (str(tiny_model_dir),), tmp_path)
    want = _low_moment_steps(Trainer(make_cfg(tiny_model_dir, lr=1e-3, micro_batch_size=2, exp_avg_dtype="bf16",
                                              exp_avg_sq_dtype="bf16")), batch())
    assert want["moments"] == [("Tensor", "torch.bfloat16")] * 2
    for r in ranks:
        assert r["moments"] == [("DTensor", "torch.bfloat16")] * 2
        for n, t in want["w1"].items():       # step 1 reads zero moments: no rounding has acted yet
            assert float((r["w1"][n] - t).abs().max()) <= 1e-5, n
        # step 2 reads rounded moments; each rank dithers its own shard: the update differs by the rounding only
        d_want = torch.cat([(want["w2"][n] - want["w0"][n]).flatten() for n in want["w0"]])
        d_rank = torch.cat([(r["w2"][n] - r["w0"][n]).flatten() for n in want["w0"]])
        assert float((d_rank - d_want).norm() / d_want.norm()) < 0.005
