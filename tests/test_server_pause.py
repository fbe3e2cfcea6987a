"""Interruptible generation over HTTP: real `slick serve` workers (and the real sglang-router) driven by HttpEngine.
pause/continue in place, weight updates while paused with per-token versions, abort by rid."""
import asyncio
import time

import pytest

from slick.engines.client import HttpEngine
from slick.engines.router import launch_router, launch_workers, router_available
from slick.types import SamplingParams
from tests.test_engine_interrupt import run, within
from tests.test_engine_local import make_spiky_model
from tests.test_server import call

pytestmark = pytest.mark.timeout(300)

N = 600                  # long enough that a pause or an abort lands in the middle
LONG = SamplingParams(temperature=0.0, max_new_tokens=N, ignore_eos=True)
PROMPT = [1, 422, 2014, 314, 253, 1232, 30]


@pytest.fixture(scope="module")
def models(tmp_path_factory):
    d, _ = make_spiky_model(tmp_path_factory.mktemp("spiky"), "llama", seed=0)
    other, _ = make_spiky_model(tmp_path_factory.mktemp("spiky-other"), "llama", seed=5)
    return d, other


@pytest.fixture(scope="module")
def workers(models):
    ws = launch_workers(models[0], 2, dtype="fp32", startup_timeout=240,   # the other weights: models[1]
                        extra_args=["--allowed-weight-dirs", str(models[1])])
    yield ws
    for w in ws:
        w.stop()


@pytest.fixture(scope="module")
def reference(models):
    """The uninterrupted greedy generation of PROMPT in-process, under the first model."""
    from slick.engine.local import LocalEngine

    eng = LocalEngine(models[0], dtype="fp32", max_running=2)
    try:
        return asyncio.run(within(eng.generate(PROMPT, LONG), 240, "the reference generation"))
    finally:
        eng.close_sync()


async def inflight(url) -> dict:
    st, info = await asyncio.to_thread(call, url, "/get_server_info")
    assert st == 200, info
    return info["inflight_tokens"]


async def wait_tokens(url, rid, k, limit=60.0):
    """Until request ``rid`` on worker ``url`` has produced at least ``k`` tokens (bounded)."""
    t0 = time.monotonic()
    while (await inflight(url)).get(rid, 0) < k:
        if time.monotonic() - t0 > limit:
            raise AssertionError(f"request {rid!r} did not reach {k} tokens on {url} within {limit}s")
        await asyncio.sleep(0.002)


async def pause_after(eng, url, rid, k):
    """Pause every worker once ``rid`` has >= k tokens on ``url``; return the count it stopped at."""
    await wait_tokens(url, rid, k)
    await eng.pause_generation()
    at = (await inflight(url))[rid]
    await asyncio.sleep(0.3)
    assert (await inflight(url))[rid] == at                  # nothing moves while paused
    st, info = await asyncio.to_thread(call, url, "/get_server_info")
    assert info["paused"] is True
    return at


def test_reference_is_not_degenerate(reference):
    assert reference.finish_reason == "length" and len(reference.token_ids) == N
    assert len(set(reference.token_ids)) > 20


def test_pause_continue_over_http_changes_nothing(workers, reference):
    url = workers[0].url

    async def go():
        eng = HttpEngine([url], control_urls=[w.url for w in workers])
        try:
            task = asyncio.ensure_future(eng.generate(PROMPT, LONG, rid="h1"))
            k = await pause_after(eng, url, "h1", 10)
            await eng.pause_generation()                     # idempotent
            assert not task.done()
            await eng.continue_generation()
            return k, await within(task, 180, "request h1 after continue_generation")
        finally:
            await eng.close()

    k, gen = run(go())
    assert 10 <= k < N
    assert gen.finish_reason == "length" and gen.token_ids == reference.token_ids
    assert gen.logprobs == pytest.approx(reference.logprobs, abs=1e-4)
    assert gen.weight_versions == [gen.weight_version] * N


def test_update_while_paused_over_http_switches_versions_at_the_pause_point(workers, reference, models):
    d, other = models
    url = workers[1].url

    async def go():
        eng = HttpEngine([url], control_urls=[w.url for w in workers])
        try:
            v = await eng.get_weight_version()
            task = asyncio.ensure_future(eng.generate(PROMPT, LONG, rid="h2"))
            k = await pause_after(eng, url, "h2", 10)
            new = await within(eng.update_weights(path=str(other), version=v + 1), 30,
                               "update_weights_from_disk while paused")
            assert (await inflight(url))["h2"] == k
            await eng.continue_generation()
            gen = await within(task, 180, "request h2 after continue_generation")
            assert await eng.update_weights(path=str(d), version=v + 2) == v + 2     # restore the weights
            return v, k, new, gen
        finally:
            await eng.close()

    v, k, new, gen = run(go())
    assert new == v + 1 and 10 <= k < N
    assert gen.finish_reason == "length" and len(gen.token_ids) == N
    assert gen.weight_versions == [v] * k + [v + 1] * (N - k)
    assert gen.token_ids[:k] == reference.token_ids[:k]
    assert gen.logprobs[:k] == pytest.approx(reference.logprobs[:k], abs=1e-4)
    assert gen.logprobs[k:] != pytest.approx(reference.logprobs[k:], abs=1e-3)


def _check_abort_pair(train, ev, reference):
    assert train.finish_reason == "abort" and 5 <= len(train.token_ids) < N
    assert train.token_ids == reference.token_ids[:len(train.token_ids)]
    assert len(train.logprobs) == len(train.weight_versions) == len(train.token_ids)
    assert ev.finish_reason == "length" and len(ev.token_ids) == N
    assert ev.token_ids == reference.token_ids
    assert ev.logprobs == pytest.approx(reference.logprobs, abs=1e-4)


def test_abort_by_rid_over_http_only_stops_that_request(workers, reference):
    url = workers[0].url

    async def go():
        eng = HttpEngine([url], control_urls=[w.url for w in workers])   # the abort reaches both workers
        try:
            train = asyncio.ensure_future(eng.generate(PROMPT, LONG, rid="train-3"))
            ev = asyncio.ensure_future(eng.generate(PROMPT, LONG, rid="eval-3"))
            await wait_tokens(url, "train-3", 5)
            await wait_tokens(url, "eval-3", 5)
            await eng.abort("train-3")
            await eng.abort("no-such-rid")                  # unknown: no-op
            t = await within(train, 10, "the aborted request train-3")
            assert not ev.done()
            return t, await within(ev, 180, "request eval-3 beside the aborted one")
        finally:
            await eng.close()

    _check_abort_pair(*run(go()), reference)


def test_duplicate_rid_is_refused_with_400(workers):
    url = workers[0].url

    async def go():
        eng = HttpEngine([url])
        try:
            await eng.pause_generation()                     # the first request waits in the engine: in flight
            a = asyncio.ensure_future(eng.generate(PROMPT, LONG, rid="dup"))
            t0 = time.monotonic()
            while "dup" not in await inflight(url):
                assert time.monotonic() - t0 < 30, "request 'dup' never reached the engine"
                await asyncio.sleep(0.01)
            st, out = await asyncio.to_thread(
                call, url, "/generate", {"input_ids": PROMPT, "rid": "dup", "sampling_params": {"max_new_tokens": 2}})
            await eng.abort("dup")
            gen = await within(a, 10, "the aborted request 'dup'")
            await eng.continue_generation()
            return st, out, gen
        finally:
            await eng.close()

    st, out, gen = run(go())
    assert st == 400 and "rid 'dup' is already in flight" in out["error"]
    assert gen.finish_reason == "abort" and gen.token_ids == []


def test_pause_mode_abort_aborts_and_new_requests_wait(workers):
    url = workers[0].url

    async def go():
        eng = HttpEngine([url])
        try:
            task = asyncio.ensure_future(eng.generate(PROMPT, LONG, rid="m1"))
            await wait_tokens(url, "m1", 3)
            st, out = await asyncio.to_thread(call, url, "/pause_generation", {"mode": "abort"})
            assert st == 200 and out["aborted"] == 1 and out["paused_requests"] == {}
            aborted = await within(task, 10, "request m1 aborted by pause mode abort")
            late = asyncio.ensure_future(eng.generate(PROMPT, SamplingParams(temperature=0, max_new_tokens=4,
                                                                             ignore_eos=True), rid="m2"))
            await asyncio.sleep(0.3)
            waiting = (await inflight(url)).get("m2")
            assert not late.done()
            await eng.continue_generation()
            return aborted, waiting, await within(late, 120, "request m2 after continue_generation")
        finally:
            await eng.close()

    aborted, waiting, late = run(go())
    assert aborted.finish_reason == "abort" and 3 <= len(aborted.token_ids) < N
    assert waiting == 0 and late.finish_reason == "length" and len(late.token_ids) == 4


def test_abort_by_rid_through_the_router(workers, reference):
    if not router_available():
        pytest.fail("sglang-router is not installed (pip install 'slick[router]')")
    router = launch_router([w.url for w in workers])

    async def go():
        eng = HttpEngine([router.url], control_urls=[w.url for w in workers])
        try:
            train = asyncio.ensure_future(eng.generate(PROMPT, LONG, rid="train-r"))
            ev = asyncio.ensure_future(eng.generate(PROMPT, LONG, rid="eval-r"))
            t0 = time.monotonic()
            while True:      # the router keeps the rid: the workers know both requests by it
                seen = {}
                for w in workers:
                    seen.update(await inflight(w.url))
                if seen.get("train-r", 0) >= 5 and seen.get("eval-r", 0) >= 5:
                    break
                assert time.monotonic() - t0 < 60, f"rids never showed up on the workers: {seen}"
                await asyncio.sleep(0.005)
            await eng.pause_generation()
            await eng.abort("train-r")
            t = await within(train, 10, "the aborted request train-r")
            await eng.continue_generation()
            return t, await within(ev, 180, "request eval-r beside the aborted one")
        finally:
            await eng.close()

    try:
        _check_abort_pair(*run(go()), reference)
    finally:
        router.stop()
