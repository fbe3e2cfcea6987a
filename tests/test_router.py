"""Two real `slick serve` workers behind the real sglang-router binary."""
import asyncio
import json
import time
import urllib.request

import pytest

from slick.engines.client import HttpEngine
from slick.engines.router import launch_router, launch_workers, router_available
from slick.types import SamplingParams

pytestmark = pytest.mark.timeout(300)

PROMPT = [1, 422, 2014, 314, 253, 1232, 30]


def post(url, body, timeout=60):
    req = urllib.request.Request(url, data=json.dumps(body).encode(), headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(req, timeout=timeout) as r:
        return json.loads(r.read())


@pytest.fixture(scope="module")
def stack(tiny_model_dir):
    if not router_available():
        pytest.fail("sglang-router is not installed (pip install 'slick[router]')")
    workers = launch_workers(tiny_model_dir, 2, dtype="fp32", startup_timeout=240)
    try:
        router = launch_router([w.url for w in workers])
    except BaseException:
        for w in workers:
            w.stop()
        raise
    yield router, workers
    router.stop()
    for w in workers:
        w.stop()


def _served_counts(workers):
    """requests_total per worker, read from each worker's /metrics."""
    out = []
    for w in workers:
        text = urllib.request.urlopen(w.url + "/metrics", timeout=10).read().decode()
        line = next(ln for ln in text.splitlines() if ln.startswith("slick_requests_total "))
        out.append(float(line.split()[1]))
    return out


def test_generate_through_router_reaches_both_workers(stack):
    router, workers = stack
    assert sorted(router.list_workers()) == sorted(w.url for w in workers)
    before = _served_counts(workers)
    outs = [post(router.url + "/generate", {"input_ids": PROMPT, "return_logprob": True,
                                            "sampling_params": {"temperature": 0, "max_new_tokens": 6}})
            for _ in range(6)]
    after = _served_counts(workers)
    assert all(o["output_ids"] == outs[0]["output_ids"] for o in outs)
    assert len(outs[0]["meta_info"]["output_token_logprobs"]) == len(outs[0]["output_ids"]) >= 1
    served = [a - b for a, b in zip(after, before)]
    assert sum(served) == 6 and min(served) >= 1          # round robin used both workers


def test_http_engine_via_router(stack, tmp_path, tiny_model_dir):
    router, workers = stack

    async def go():
        eng = HttpEngine([router.url], control_urls=[w.url for w in workers])
        try:
            assert await eng.health()
            sp = SamplingParams(temperature=1.0, max_new_tokens=8)
            gens = await asyncio.gather(*(eng.generate(PROMPT, sp) for _ in range(8)))
            v = await eng.update_weights(path=str(tiny_model_dir), version=11)
            after = await eng.generate(PROMPT, sp)
            return gens, v, after
        finally:
            await eng.close()

    gens, v, after = asyncio.run(go())
    assert all(g.finish_reason in ("stop", "length") and len(g.logprobs) == len(g.token_ids) for g in gens)
    assert v == 11 and after.weight_version == 11


def test_remove_and_add_worker_while_running(stack):
    router, workers = stack
    gone = workers[0].url
    router.remove_worker(gone)
    assert router.list_workers() == [workers[1].url]
    before = _served_counts(workers)
    for _ in range(4):
        post(router.url + "/generate", {"input_ids": PROMPT, "sampling_params": {"max_new_tokens": 2}})
    after = _served_counts(workers)
    assert after[0] == before[0] and after[1] == before[1] + 4
    router.add_worker(gone)
    assert sorted(router.list_workers()) == sorted(w.url for w in workers)
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:                    # the re-added worker gets traffic again
        post(router.url + "/generate", {"input_ids": PROMPT, "sampling_params": {"max_new_tokens": 1}})
        if _served_counts(workers)[0] > after[0]:
            break
    assert _served_counts(workers)[0] > after[0]
    with pytest.raises(KeyError):
        router.remove_worker("http://127.0.0.1:1")


def test_router_metrics_port_answers(stack):
    router, _ = stack
    text = urllib.request.urlopen(router.metrics_url, timeout=10).read().decode()
    assert "# TYPE" in text
