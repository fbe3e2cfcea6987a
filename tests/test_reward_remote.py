"""remote_rm against a real aiohttp server on 127.0.0.1 (random port), started in each test."""
import asyncio
import socket
from collections import Counter

from aiohttp import web

from slick.config import Config
from slick.reward import RewardHub
from slick.reward.remote import parse_reply
from slick.types import Sample


class RewardServer:
    """A tiny reward server: /ok (exact match), /flaky (500 twice per response, then OK),
    /always500, /dict (dict reward), /slow (never answers in time), /bad (not JSON), /teapot (418),
    /nan (response "float": a bare NaN; otherwise a dict whose "score" is the response as a float)."""

    def __init__(self):
        self.requests: list[dict] = []
        self.attempts: Counter = Counter()
        app = web.Application()
        for name in ("ok", "flaky", "always500", "dict", "slow", "bad", "teapot", "nan"):
            app.router.add_post(f"/{name}", getattr(self, name))
        self.runner = web.AppRunner(app)
        self.port = None
        self.stopping = asyncio.Event()

    async def __aenter__(self):
        await self.runner.setup()
        site = web.TCPSite(self.runner, "127.0.0.1", 0)
        await site.start()
        self.port = site._server.sockets[0].getsockname()[1]
        return self

    async def __aexit__(self, *exc):
        self.stopping.set()                    # release /slow handlers so cleanup is quick
        await self.runner.cleanup()

    def url(self, name):
        return f"http://127.0.0.1:{self.port}/{name}"

    async def _body(self, request):
        body = await request.json()
        self.requests.append(body)
        self.attempts[body["response"]] += 1
        return body

    async def ok(self, request):
        b = await self._body(request)
        return web.json_response({"reward": 1.0 if b["response"] == b["label"] else 0.0})

    async def flaky(self, request):
        b = await self._body(request)
        if self.attempts[b["response"]] <= 2:
            return web.Response(status=503, text="warming up")
        return web.json_response(0.25)

    async def always500(self, request):
        await self._body(request)
        return web.Response(status=500, text="internal error")

    async def dict(self, request):
        b = await self._body(request)
        return web.json_response({"acc": 1.0, "format": 0.5, "n": len(b["response"])})

    async def slow(self, request):
        await self._body(request)
        try:
            await asyncio.wait_for(self.stopping.wait(), 5)
        except asyncio.TimeoutError:
            pass
        return web.json_response(1.0)

    async def bad(self, request):
        await self._body(request)
        return web.Response(text="<html>oops</html>")

    async def teapot(self, request):
        await self._body(request)
        return web.Response(status=418, text="no")

    async def nan(self, request):
        b = await self._body(request)
        if b["response"] == "float":
            return web.Response(text="NaN", content_type="application/json")
        return web.json_response({"score": float(b["response"]), "acc": 1.0})   # json writes NaN/Infinity


def cfg(url, **kw):
    flat = dict(rm_type="remote_rm", rm_url=url, rm_timeout=2.0, rm_max_retries=3)
    flat.update(kw)
    return Config.from_flat(flat)


def group(responses, label="yes"):
    return [Sample(index=i, prompt=[{"role": "user", "content": "q?"}], response=r, label=label,
                   metadata={"row": i}) for i, r in enumerate(responses)]


async def score(hub, g):
    try:
        await hub.score_group(g)
    finally:
        await hub.close()


def test_remote_ok_sends_prompt_response_label():
    async def go():
        async with RewardServer() as srv:
            hub = RewardHub(cfg(srv.url("ok")), remote_backoff=0.01)
            g = group(["yes", "no"])
            await score(hub, g)
            return srv, hub, g
    srv, hub, g = asyncio.run(go())
    assert [s.reward for s in g] == [1.0, 0.0]
    assert sorted(srv.requests, key=lambda b: b["response"]) == [
        {"prompt": [{"role": "user", "content": "q?"}], "response": "no", "label": "yes"},
        {"prompt": [{"role": "user", "content": "q?"}], "response": "yes", "label": "yes"}]
    assert hub.stats()["reward/retries"] == 0 and hub.stats()["reward/failures"] == 0


def test_remote_retries_then_succeeds():
    async def go():
        async with RewardServer() as srv:
            hub = RewardHub(cfg(srv.url("flaky"), rm_max_retries=3), remote_backoff=0.01)
            g = group(["a", "b"])
            await score(hub, g)
            return srv, hub, g
    srv, hub, g = asyncio.run(go())
    assert [s.reward for s in g] == [0.25, 0.25]
    assert srv.attempts == {"a": 3, "b": 3}
    assert hub.stats()["reward/retries"] == 4 and hub.stats()["reward/failures"] == 0


def test_remote_too_few_retries_fails():
    async def go():
        async with RewardServer() as srv:
            hub = RewardHub(cfg(srv.url("flaky"), rm_max_retries=1), remote_backoff=0.01)
            g = group(["a"])
            await score(hub, g)
            return srv, g
    srv, g = asyncio.run(go())
    assert srv.attempts == {"a": 2}
    assert g[0].reward == 0.0 and "HTTP 503" in g[0].metadata["reward_error"]


def test_remote_always_500_gives_failure_reward():
    async def go():
        async with RewardServer() as srv:
            hub = RewardHub(cfg(srv.url("always500"), rm_max_retries=2, rm_failure_reward=-1.0),
                            remote_backoff=0.01)
            g = group(["a", "b", "c"])
            await score(hub, g)
            return srv, hub, g
    srv, hub, g = asyncio.run(go())
    assert [s.reward for s in g] == [-1.0, -1.0, -1.0]
    assert srv.attempts == {"a": 3, "b": 3, "c": 3}        # 1 try + 2 retries each, then give up
    assert all("after 3 attempts" in s.metadata["reward_error"] for s in g)
    st = hub.stats()
    assert st["reward/failures"] == 3 and st["reward/retries"] == 6 and st["reward/timeouts"] == 0


def test_remote_no_retry_on_4xx_or_bad_body():
    async def go():
        async with RewardServer() as srv:
            out = []
            for name in ("teapot", "bad"):
                hub = RewardHub(cfg(srv.url(name)), remote_backoff=0.01)
                g = group([name])
                await score(hub, g)
                out.append(g[0])
            return srv, out
    srv, (teapot, bad) = asyncio.run(go())
    assert srv.attempts == {"teapot": 1, "bad": 1}
    assert "HTTP 418" in teapot.metadata["reward_error"]
    assert "bad reply" in bad.metadata["reward_error"]


def test_remote_timeout_and_connection_refused():
    with socket.socket() as s:                 # a port nobody listens on
        s.bind(("127.0.0.1", 0))
        dead_port = s.getsockname()[1]

    async def go():
        async with RewardServer() as srv:
            slow_hub = RewardHub(cfg(srv.url("slow"), rm_timeout=0.3, rm_max_retries=1), remote_backoff=0.01)
            slow = group(["s"])
            await score(slow_hub, slow)
        dead_hub = RewardHub(cfg(f"http://127.0.0.1:{dead_port}/x", rm_max_retries=2), remote_backoff=0.01)
        dead = group(["d"])
        await score(dead_hub, dead)
        return srv, slow_hub, slow, dead_hub, dead
    srv, slow_hub, slow, dead_hub, dead = asyncio.run(go())
    assert srv.attempts == {"s": 2}
    assert "no reply within 0.3s" in slow[0].metadata["reward_error"]
    assert slow_hub.stats()["reward/timeouts"] == 1
    assert "after 3 attempts" in dead[0].metadata["reward_error"]
    assert dead_hub.stats()["reward/retries"] == 2 and dead_hub.stats()["reward/timeouts"] == 0


def test_remote_dict_reward_and_metadata_override():
    async def go():
        async with RewardServer() as srv:
            hub = RewardHub(cfg(srv.url("dict"), rm_type="exact", reward_key="format"), remote_backoff=0.01)
            g = group(["yes", "abc"])
            g[1].metadata["rm_type"] = "remote_rm"        # this sample goes to the server
            await score(hub, g)
            return srv, hub, g
    srv, hub, g = asyncio.run(go())
    assert g[0].reward == 1.0                              # exact match, no request made
    assert g[1].reward == {"acc": 1.0, "format": 0.5, "n": 3}
    assert [hub.scalar(s) for s in g] == [1.0, 0.5]
    assert [b["response"] for b in srv.requests] == ["abc"]


def test_parse_reply():
    assert parse_reply(1) == 1.0
    assert parse_reply({"reward": 0.5}) == 0.5
    assert parse_reply({"reward": {"a": 1}}) == {"a": 1}
    assert parse_reply({"reward": 0.5, "acc": 1}) == {"reward": 0.5, "acc": 1}
    for bad in ("1", None, [1.0], True):
        try:
            parse_reply(bad)
        except ValueError:
            continue
        raise AssertionError(f"parse_reply accepted {bad!r}")


def test_remote_non_finite_rewards_fail_and_are_counted():
    async def go():
        async with RewardServer() as srv:
            hub = RewardHub(cfg(srv.url("nan"), reward_key="score", rm_failure_reward=-1.0), remote_backoff=0.01)
            g = group(["float", "nan", "inf", "-inf", "0.5"])
            await score(hub, g)
            return srv, hub, g
    srv, hub, g = asyncio.run(go())
    assert [s.reward for s in g[:4]] == [-1.0] * 4
    assert g[4].reward == {"score": 0.5, "acc": 1.0} and hub.scalar(g[4]) == 0.5
    assert "non-finite reward nan" in g[0].metadata["reward_error"]
    for s, v in zip(g[1:4], ("nan", "inf", "-inf")):
        assert f"dict reward field 'score' of sample {s.index} is not finite ({v})" in s.metadata["reward_error"]
    assert srv.attempts["float"] == 1                 # not retried
    st = hub.stats()
    assert st["reward/failures"] == 4 and st["reward/nonfinite"] == 4


class RestartableServer:
    """A real reward server on a fixed 127.0.0.1 port that can be stopped and started again on that port."""

    def __init__(self, port):
        self.port, self.runner, self.served = port, None, 0

    async def start(self):
        async def score(request):
            body = await request.json()
            self.served += 1
            return web.json_response({"reward": 1.0 if body["response"] == body["label"] else 0.0})

        app = web.Application()
        app.router.add_post("/score", score)
        self.runner = web.AppRunner(app)
        await self.runner.setup()
        await web.TCPSite(self.runner, "127.0.0.1", self.port).start()

    async def stop(self):
        await self.runner.cleanup()

    @property
    def url(self):
        return f"http://127.0.0.1:{self.port}/score"


def _free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_remote_server_down_then_back_is_ridden_out():
    """Stopped after one group, restarted on the same port 0.4 s later while calls retry: no failure."""
    async def go():
        srv = RestartableServer(_free_port())
        await srv.start()
        # backoff 0.05 doubling, capped at 8 s: 8 retries wait 0.05+0.1+...+6.4 = 12.75 s in all
        hub = RewardHub(cfg(srv.url, rm_max_retries=8), remote_backoff=0.05)
        first = group(["yes", "no"])
        await hub.score_group(first)                 # keep-alive connections now sit in the pool
        await srv.stop()
        second = group(["yes", "yes", "no"])
        task = asyncio.create_task(hub.score_group(second))
        await asyncio.sleep(0.4)
        assert not task.done()                       # still retrying against the dead port
        await srv.start()
        await asyncio.wait_for(task, 20)
        stats = hub.stats()
        await hub.close()
        await srv.stop()
        return srv, first, second, stats
    srv, first, second, st = asyncio.run(go())
    assert [s.reward for s in first] == [1.0, 0.0]
    assert [s.reward for s in second] == [1.0, 1.0, 0.0]
    assert all("reward_error" not in s.metadata for s in second)
    assert srv.served == 5
    assert st["reward/failures"] == 0 and st["reward/remote_giveups"] == 0
    assert st["reward/remote_outages"] == 1 and st["reward/remote_recoveries"] == 1
    assert st["reward/retries"] >= 3 and st["reward/retries"] == st["reward/remote_retries"]
    assert 0.3 < st["reward/remote_down_s"] < 10


def test_remote_server_down_too_long_fails_named_then_is_used_again(caplog):
    """Down longer than the retries last: the failure reward, a message naming the URL, counted;
    once the server is back on the same port the next group is scored normally."""
    async def go():
        srv = RestartableServer(_free_port())
        await srv.start()
        hub = RewardHub(cfg(srv.url, rm_max_retries=2, rm_failure_reward=-1.0), remote_backoff=0.01)
        await hub.score_group(group(["yes"]))
        await srv.stop()
        lost = group(["yes", "no"])
        await hub.score_group(lost)
        mid = hub.stats()
        await srv.start()
        back = group(["yes", "no"])
        await hub.score_group(back)
        stats = hub.stats()
        await hub.close()
        await srv.stop()
        return srv, lost, back, mid, stats
    with caplog.at_level("WARNING", logger="slick.reward"):
        srv, lost, back, mid, st = asyncio.run(go())
    assert [s.reward for s in lost] == [-1.0, -1.0]
    for s in lost:
        err = s.metadata["reward_error"]
        assert err.startswith(f"reward server {srv.url} failed after 3 attempts"), err
    assert mid["reward/failures"] == 2 and mid["reward/remote_giveups"] == 2
    assert mid["reward/remote_outages"] == 1 and mid["reward/remote_recoveries"] == 0
    assert [s.reward for s in back] == [1.0, 0.0]
    assert all("reward_error" not in s.metadata for s in back)
    assert srv.served == 3
    assert st["reward/failures"] == 2 and st["reward/remote_recoveries"] == 1
    text = caplog.text
    assert f"reward server {srv.url} is failing" in text
    assert f"reward server {srv.url} answers again after" in text


def test_remote_retry_window_and_worst_case():
    from slick.reward.remote import RemoteRM

    rm = RemoteRM("http://127.0.0.1:1/x", timeout=2.0, max_retries=8, backoff=0.5, max_backoff=8.0)
    assert rm.retry_window_seconds() == 0.5 + 1 + 2 + 4 + 8 + 8 + 8 + 8
    assert rm.worst_case_seconds() == 2.0 * 9 + 39.5
    assert RemoteRM("http://x", max_retries=3).retry_window_seconds() == 3.5
