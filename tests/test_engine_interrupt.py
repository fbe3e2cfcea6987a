"""LocalEngine: interruptible generation. Pause/continue in place, weight updates while paused with per-token
weight versions, and per-request abort by rid. Inline and threaded schedulers both."""
import asyncio
import time

import pytest

from slick.engine.local import LocalEngine
from slick.types import Sample, SamplingParams
from tests.test_engine_local import make_spiky_model

pytestmark = pytest.mark.timeout(300)

N = 400                                    # long enough that a pause or an abort lands in the middle
LONG = SamplingParams(temperature=0.0, max_new_tokens=N, ignore_eos=True)
PROMPT = [1, 422, 2014, 314, 253, 1232, 30]


@pytest.fixture(scope="module")
def spiky(tmp_path_factory):
    """A model whose greedy continuation varies token to token, and a second one (other weights)."""
    d, _ = make_spiky_model(tmp_path_factory.mktemp("spiky"), "llama", seed=0)
    other, m2 = make_spiky_model(tmp_path_factory.mktemp("spiky-other"), "llama", seed=5)
    return d, other, {k: v.clone() for k, v in m2.state_dict().items()}


@pytest.fixture(scope="module")
def reference(spiky):
    """The uninterrupted greedy generation of PROMPT (N tokens) under the first model."""
    eng = LocalEngine(spiky[0], dtype="fp32", max_running=4)
    try:
        return asyncio.run(within(eng.generate(PROMPT, LONG), 240, "the reference generation"))
    finally:
        eng.close_sync()


@pytest.fixture(params=[False, True], ids=["inline", "threaded"])
def engine(request, spiky):
    eng = LocalEngine(spiky[0], dtype="fp32", max_running=4, threaded=request.param)
    yield eng
    eng.close_sync()


async def within(aw, seconds, what):
    """Await ``aw`` for at most ``seconds``; on timeout fail naming ``what``."""
    try:
        return await asyncio.wait_for(aw, seconds)
    except asyncio.TimeoutError:
        raise AssertionError(f"{what} did not finish within {seconds}s") from None


def run(coro, limit=240, what="the test's requests"):
    return asyncio.run(within(coro, limit, what))


async def wait_tokens(eng, rid, k, limit=60.0):
    """Until request ``rid`` has produced at least ``k`` tokens (bounded)."""
    t0 = time.monotonic()
    while eng.progress().get(rid, 0) < k:
        if time.monotonic() - t0 > limit:
            raise AssertionError(f"request {rid!r} did not reach {k} tokens within {limit}s "
                                 f"(progress {eng.progress()})")
        await asyncio.sleep(0 if not eng.threaded else 0.001)


async def pause_after(eng, rid, k):
    """Pause once ``rid`` has >= k tokens; return the exact count it stopped at, checked to stay put."""
    await wait_tokens(eng, rid, k)
    await eng.pause_generation()
    at = eng.progress()[rid]
    steps = eng.stats()["decode_steps"]
    await asyncio.sleep(0.3)                              # nothing moves while paused
    assert eng.progress()[rid] == at and eng.stats()["decode_steps"] == steps
    assert eng.paused and eng.stats()["paused"] is True
    return at


def test_reference_is_not_degenerate(reference):
    assert reference.finish_reason == "length" and len(reference.token_ids) == N
    assert len(set(reference.token_ids)) > 20             # a token sequence that changes, so matches mean something
    assert reference.weight_versions == [0] * N


def test_pause_continue_without_update_changes_nothing(engine, reference):
    async def go():
        task = asyncio.ensure_future(engine.generate(PROMPT, LONG, rid="r1"))
        k = await pause_after(engine, "r1", 10)
        await engine.pause_generation()                   # idempotent
        assert not task.done()
        await engine.continue_generation()
        await engine.continue_generation()                # idempotent
        return k, await within(task, 180, "request r1 after continue_generation")

    k, gen = run(go())
    assert 10 <= k < N
    assert gen.finish_reason == "length" and gen.token_ids == reference.token_ids
    assert gen.logprobs == pytest.approx(reference.logprobs, abs=1e-5)
    assert gen.weight_versions == [0] * N and not engine.paused


def test_update_while_paused_switches_versions_at_the_pause_point(engine, reference, spiky):
    _, _, new_weights = spiky

    async def go():
        task = asyncio.ensure_future(engine.generate(PROMPT, LONG, rid="r1"))
        k = await pause_after(engine, "r1", 10)
        v = await within(engine.update_weights(named_tensors=new_weights.items()), 30,
                           "update_weights while paused")
        assert engine.progress()["r1"] == k               # the update ran no step either
        late = asyncio.ensure_future(engine.generate(PROMPT, SamplingParams(temperature=0.0, max_new_tokens=5,
                                                                            ignore_eos=True), rid="late"))
        await asyncio.sleep(0.1)
        assert engine.progress()["late"] == 0 and not late.done()   # accepted, waits for continue
        await engine.continue_generation()
        return (k, v, await within(task, 180, "request r1 after continue_generation"),
                await within(late, 180, "request late after continue_generation"))

    k, v, gen, late = run(go())
    assert v == 1 and 10 <= k < N
    assert gen.finish_reason == "length" and len(gen.token_ids) == N
    assert gen.weight_versions == [0] * k + [1] * (N - k)
    assert gen.weight_version == 1
    assert gen.token_ids[:k] == reference.token_ids[:k]
    assert gen.logprobs[:k] == pytest.approx(reference.logprobs[:k], abs=1e-5)
    # the later tokens come from the new weights: not the old continuation
    assert gen.logprobs[k:] != pytest.approx(reference.logprobs[k:], abs=1e-3)
    assert late.weight_versions == [1] * 5
    s = Sample()
    s.apply_generation(gen)
    assert s.weight_versions == [0] * k + [1] * (N - k)


def test_pause_update_continue_does_not_deadlock(engine, spiky):
    d, other, _ = spiky

    async def go():
        tasks = [asyncio.ensure_future(engine.generate(PROMPT, LONG, rid=f"r{i}")) for i in range(3)]
        await wait_tokens(engine, "r2", 2)
        for version, path in ((7, other), (8, d)):         # twice, from a directory, with running requests
            await within(engine.pause_generation(), 30, "pause_generation")
            assert await within(engine.update_weights(path=str(path), version=version), 30,
                                "update_weights while paused") == version
            await within(engine.continue_generation(), 30, "continue_generation")
            await asyncio.sleep(0.01)
        return await within(asyncio.gather(*tasks), 180, "the three requests after the updates")

    gens = run(go())
    for g in gens:
        assert g.finish_reason == "length" and len(g.token_ids) == N
        assert g.weight_versions == sorted(g.weight_versions) and g.weight_versions[-1] == 8


def test_abort_by_rid_only_stops_that_request(engine, reference):
    async def go():
        train = asyncio.ensure_future(engine.generate(PROMPT, LONG, rid="train-7"))
        ev = asyncio.ensure_future(engine.generate(PROMPT, LONG, rid="eval-7"))
        await wait_tokens(engine, "train-7", 5)
        await wait_tokens(engine, "eval-7", 5)
        await engine.abort("train-7")
        await engine.abort("train-7")                     # finished: no-op
        await engine.abort("no-such-rid")                 # unknown: no-op
        t = await within(train, 5, "the aborted request train-7")   # returns promptly
        assert not ev.done()
        return t, await within(ev, 180, "request eval-7 beside the aborted one")

    t, e = run(go())
    assert t.finish_reason == "abort" and 5 <= len(t.token_ids) < N
    assert t.token_ids == reference.token_ids[:len(t.token_ids)]
    assert len(t.logprobs) == len(t.weight_versions) == len(t.token_ids)
    assert e.finish_reason == "length" and len(e.token_ids) == N
    assert e.token_ids == reference.token_ids                     # the abort beside it changed nothing
    assert e.logprobs == pytest.approx(reference.logprobs, abs=1e-5)
    assert engine.progress() == {} and engine.stats()["running"] == 0


def test_abort_while_paused_and_of_a_queued_request(spiky):
    eng = LocalEngine(spiky[0], dtype="fp32", max_running=1)       # one slot: the second request queues
    try:
        async def go():
            a = asyncio.ensure_future(eng.generate(PROMPT, LONG, rid="a"))
            b = asyncio.ensure_future(eng.generate(PROMPT, LONG, rid="b"))
            await wait_tokens(eng, "a", 3)
            await eng.pause_generation()
            ka = eng.progress()["a"]
            assert eng.stats()["queued"] == 1 and eng.progress()["b"] == 0
            await eng.abort("b")                          # queued
            await eng.abort("a")                          # running, while paused
            ga, gb = await within(asyncio.gather(a, b), 5, "requests a and b aborted while paused")
            await eng.continue_generation()
            again = await eng.generate(PROMPT, SamplingParams(temperature=0.0, max_new_tokens=3), rid="a")
            return ka, ga, gb, again

        ka, ga, gb, again = run(go())
        assert ga.finish_reason == "abort" and len(ga.token_ids) == ka
        assert gb.finish_reason == "abort" and gb.token_ids == [] and gb.weight_versions == []
        assert again.finish_reason == "length" and len(again.token_ids) == 3   # the rid is free again
    finally:
        eng.close_sync()


def test_duplicate_rid_in_flight_is_refused(engine):
    async def go():
        await engine.pause_generation()                   # the first request stays queued: in flight
        a = asyncio.ensure_future(engine.generate(PROMPT, LONG, rid="same"))
        await asyncio.sleep(0.05)
        assert engine.progress() == {"same": 0}
        with pytest.raises(ValueError, match="rid 'same' is already in flight"):
            await engine.generate(PROMPT, LONG, rid="same")
        await engine.abort("same")
        gen = await within(a, 5, "the aborted queued request 'same'")
        await engine.continue_generation()
        return gen

    gen = run(go())
    assert gen.finish_reason == "abort" and gen.token_ids == []
