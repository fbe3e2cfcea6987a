"""Routing replay over HTTP: `slick serve` answers SGLang's ``return_routed_experts`` (int32 ``[positions, MoE layers,
k]`` from ``routed_experts_start_len``, base64 in ``meta_info.routed_experts``), ``HttpEngine`` asks for them and
turns them back into slick's record, and a `slick train --use-routing-replay` run through `slick serve` workers
replays them."""
import asyncio
import base64
import json
import urllib.error
import urllib.request

import numpy as np
import pytest
import torch

from slick.algo.routing import decode_routing
from slick.engine.arch import ArchConfig
from slick.engine.local import LocalEngine
from slick.engines.client import EngineError, HttpEngine
from slick.engines.router import launch_workers
from slick.types import SamplingParams
from tests.test_loop import make_cfg, prompts  # noqa: F401 - the prompts fixture
from tests.test_moe_engine import spiky_moe

pytestmark = pytest.mark.timeout(300)

PROMPTS = [[5, 17, 200, 33, 9, 41], [7, 7, 300]]


@pytest.fixture(scope="module")
def moe(tmp_path_factory):
    d, _ = spiky_moe(tmp_path_factory.mktemp("moe"), "mixtral")
    return d


@pytest.fixture(scope="module")
def worker(moe):
    # one OpenMP thread: the experts' index_add slows down ~50x when two threads share a loaded 2-core machine
    (w,) = launch_workers(moe, 1, dtype="fp32", startup_timeout=240, threads=1)
    yield w
    w.stop()


def post(url, body):
    req = urllib.request.Request(url + "/generate", data=json.dumps(body).encode(),
                                 headers={"Content-Type": "application/json"})
    try:
        with urllib.request.urlopen(req, timeout=120) as r:
            return r.status, json.loads(r.read())
    except urllib.error.HTTPError as e:
        return e.code, json.loads(e.read())


def test_routed_experts_over_http_equal_the_in_process_engines(moe, worker):
    spec = ArchConfig.from_dir(moe).moe
    shape = (len(spec.layers), spec.top_k)
    assert shape == (2, 2)
    sps = [SamplingParams(max_new_tokens=6, temperature=0.0),
           SamplingParams(max_new_tokens=6, temperature=1.0, seed=11)]

    async def run(engine):
        return [await engine.generate(p, sp) for p in PROMPTS for sp in sps]

    local = LocalEngine(str(moe), dtype="fp32")
    try:
        want = asyncio.run(run(local))
    finally:
        asyncio.run(local.close())
    plain, streamed = HttpEngine([worker.url], routing=shape), HttpEngine([worker.url], routing=shape)
    streamed.fault_tolerant = True     # the streamed path (--use-fault-tolerance) reads them from the final chunk
    got = asyncio.run(run(plain))
    got_streamed = asyncio.run(run(streamed))
    asyncio.run(plain.close())
    asyncio.run(streamed.close())
    prompts = [p for p in PROMPTS for _ in sps]
    for w, g, s, p in zip(want, got, got_streamed, prompts):
        assert g.token_ids == w.token_ids == s.token_ids
        ref = decode_routing(w.routed_experts)
        assert list(ref.shape) == [len(p) + len(w.token_ids) - 1, 2, 2]
        assert torch.equal(decode_routing(g.routed_experts), ref)
        assert torch.equal(decode_routing(s.routed_experts), ref)
    assert len(torch.unique(torch.cat([decode_routing(w.routed_experts).flatten() for w in want]))) == 4
    # without routing replay the client does not ask, and the generation carries no record
    bare = HttpEngine([worker.url])
    assert asyncio.run(bare.generate(PROMPTS[0], sps[0])).routed_experts is None
    asyncio.run(bare.close())


def test_routed_experts_start_len_slices_the_positions(worker):
    p = PROMPTS[0]
    body = {"input_ids": p, "sampling_params": {"max_new_tokens": 5, "temperature": 0.0},
            "return_routed_experts": True}
    st, full = post(worker.url, body)
    assert st == 200, full
    n = full["meta_info"]["completion_tokens"]
    assert n == 5
    raw = base64.b64decode(full["meta_info"]["routed_experts"])
    assert len(raw) == (len(p) + n - 1) * 2 * 2 * 4      # int32, [positions, layers, k]
    whole = np.frombuffer(raw, dtype=np.int32).reshape(-1, 2, 2)
    assert whole.min() >= 0 and whole.max() <= 3
    for start in (1, 4, len(p)):
        st, out = post(worker.url, {**body, "routed_experts_start_len": start})
        assert st == 200, out
        part = np.frombuffer(base64.b64decode(out["meta_info"]["routed_experts"]), dtype=np.int32).reshape(-1, 2, 2)
        assert part.shape[0] == len(p) + n - 1 - start
        assert np.array_equal(part, whole[start:])
    st, out = post(worker.url, {k: v for k, v in body.items() if k != "return_routed_experts"})
    assert st == 200 and "routed_experts" not in out["meta_info"]
    for bad in (-1, len(p) + 1, "2", True, 1.5):
        st, out = post(worker.url, {**body, "routed_experts_start_len": bad})
        assert st == 400, (bad, out)
        assert f"routed_experts_start_len must be an integer in [0, {len(p)}]" in out["error"]
    st, out = post(worker.url, {**body, "return_routed_experts": "yes"})
    assert st == 400 and "return_routed_experts must be a boolean" in out["error"]


def test_a_dense_model_has_no_routed_experts_to_return(server):    # conftest: slick serve on a tiny llama
    st, out = post(server.url, {"input_ids": [1, 2, 3], "sampling_params": {"max_new_tokens": 2},
                                "return_routed_experts": True})
    assert st == 400
    assert "return_routed_experts" in out["error"] and "has no experts" in out["error"]

    async def ask():
        eng = HttpEngine([server.url], routing=(2, 2))
        try:
            await eng.generate([1, 2, 3], SamplingParams(max_new_tokens=2))
        finally:
            await eng.close()
    with pytest.raises(EngineError, match="HTTP 400.*has no experts"):
        asyncio.run(ask())


def test_train_with_routing_replay_through_slick_serve_workers(tmp_path, prompts, monkeypatch):  # noqa: F811
    from slick.loop.sync import train

    monkeypatch.setenv("OMP_NUM_THREADS", "1")    # the worker's (see the worker fixture)
    from slick.models.tiny import make_tiny_model

    model = make_tiny_model(tmp_path / "moe", arch="mixtral", seed=4, initializer_range=0.2)
    cfg = make_cfg(model, prompts, tmp_path / "run", num_rollout=2, use_routing_replay=True,
                   rollout_engine="http", rollout_num_workers=1)
    asyncio.run(train(cfg))
    rows = [json.loads(line) for line in (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in rows] == [1, 2]
    for r in rows:
        # every sample carried the record the worker returned, and (engine and trainer holding the same weights,
        # fp32) each recorded token's experts are the trainer's own top-k
        assert r["train/moe/replay_missing_samples"] == 0.0
        assert r["train/moe/mismatch"] == 0.0
        assert r["train/train_rollout_logprob_abs_diff_max"] < 1e-4

