"""HttpEngine against two real `slick serve` workers: generate, weights, abort, fail-over."""
import asyncio

import pytest

from slick.engines.client import EngineError, HttpEngine
from slick.engines.router import free_port, launch_workers
from slick.types import SamplingParams

pytestmark = pytest.mark.timeout(300)

PROMPT = [1, 422, 2014, 314, 253, 1232, 30]
GREEDY = SamplingParams(temperature=0.0, max_new_tokens=8)


@pytest.fixture(scope="module")
def workers(tiny_model_dir, tmp_path_factory):
    ws = launch_workers(tiny_model_dir, 2, dtype="fp32", startup_timeout=240,   # weights from the tests' tmp dirs
                        extra_args=["--allowed-weight-dirs", str(tmp_path_factory.getbasetemp())])
    yield ws
    for w in ws:
        w.stop()


def run(coro):
    return asyncio.run(coro)


def test_generate_round_robin_same_greedy(workers):
    async def go():
        eng = HttpEngine([w.url for w in workers], concurrency=4)
        try:
            assert await eng.health()
            gens = await asyncio.gather(*(eng.generate(PROMPT, GREEDY) for _ in range(6)))
            report = await eng.health_report()
        finally:
            await eng.close()
        return gens, report

    gens, report = run(go())
    assert all(report.values()) and len(report) == 2
    first = gens[0]
    assert 1 <= len(first.token_ids) <= 8 and len(first.logprobs) == len(first.token_ids)
    assert first.prompt_tokens == len(PROMPT) and first.finish_reason in ("stop", "length")
    for g in gens[1:]:                          # both workers load the same weights -> same greedy output
        assert g.token_ids == first.token_ids
        assert g.logprobs == pytest.approx(first.logprobs, abs=1e-5)


def test_session_survives_separate_event_loops(workers):
    eng = HttpEngine([workers[0].url])
    a = run(eng.generate(PROMPT, GREEDY))
    b = run(eng.generate(PROMPT, GREEDY))       # new loop: a new pooled session is created lazily
    run(eng.close())
    assert a.token_ids == b.token_ids


def test_update_weights_reaches_every_worker(workers, tiny_model_dir, tmp_path):
    from slick.models.tiny import make_tiny_model

    other = make_tiny_model(tmp_path / "other", seed=5)

    async def go():
        eng = HttpEngine([w.url for w in workers])
        try:
            before = await eng.generate(PROMPT, GREEDY)
            v = await eng.update_weights(path=str(other), version=3)
            per_worker = [await HttpEngine([w.url]).get_weight_version() for w in workers]
            gens = [await eng.generate(PROMPT, GREEDY) for _ in range(4)]
            with pytest.raises(EngineError, match="path="):
                await eng.update_weights(named_tensors=[("x", None)])
            with pytest.raises(EngineError, match="update_weights_from_disk"):
                await eng.update_weights(path=str(tmp_path / "missing"), version=9)
            v2 = await eng.update_weights(path=str(tiny_model_dir), version=4)
            return before, v, per_worker, gens, v2, await eng.get_weight_version()
        finally:
            await eng.close()

    before, v, per_worker, gens, v2, now = run(go())
    assert v == 3 and per_worker == [3, 3]
    assert all(g.weight_version == 3 for g in gens)
    assert gens[0].logprobs != pytest.approx(before.logprobs, abs=1e-3)
    assert v2 == 4 and now == 4


def test_abort_all_returns_partial_abort(workers):
    async def go():
        eng = HttpEngine([w.url for w in workers])
        try:
            long = SamplingParams(temperature=1.0, max_new_tokens=1500, seed=2)
            tasks = [asyncio.ensure_future(eng.generate(PROMPT, long)) for _ in range(2)]
            await asyncio.sleep(0.5)
            await eng.abort_all()
            return await asyncio.wait_for(asyncio.gather(*tasks), 60)
        finally:
            await eng.close()

    gens = run(go())
    assert [g.finish_reason for g in gens] == ["abort", "abort"]
    assert all(len(g.token_ids) < 1500 for g in gens)


def test_bad_request_raises_engine_error_without_retry(workers):
    async def go():
        eng = HttpEngine([w.url for w in workers])
        try:
            await eng.generate([10 ** 9], GREEDY)
        finally:
            await eng.close()

    with pytest.raises(EngineError, match="outside the vocabulary"):
        run(go())


def test_no_worker_left_raises_clear_error():
    dead = f"http://127.0.0.1:{free_port()}"

    async def go():
        eng = HttpEngine([dead], max_retries=2, timeout=5)
        try:
            assert not await eng.health()
            await eng.generate(PROMPT, GREEDY)
        finally:
            await eng.close()

    with pytest.raises(EngineError, match="no worker could serve /generate after 3 attempt"):
        run(go())


def test_worker_killed_mid_rollout_requests_retried_elsewhere(workers):
    """Runs last: kills worker 0 while requests are in flight; all of them finish on worker 1."""
    async def go():
        eng = HttpEngine([w.url for w in workers], max_retries=3, timeout=60)
        try:
            sp = SamplingParams(temperature=1.0, max_new_tokens=300, seed=0)
            tasks = [asyncio.ensure_future(eng.generate(PROMPT, sp)) for _ in range(8)]
            await asyncio.sleep(0.05)
            workers[0].kill()
            gens = await asyncio.wait_for(asyncio.gather(*tasks), 120)
            more = await asyncio.gather(*(eng.generate(PROMPT, GREEDY) for _ in range(4)))
            assert eng.num_retries >= 1
            return gens, more, await eng.health_report()
        finally:
            await eng.close()

    gens, more, report = run(go())
    assert len(gens) == 8 and all(g.finish_reason in ("stop", "length") for g in gens + more)
    assert report == {workers[0].url: False, workers[1].url: True}
