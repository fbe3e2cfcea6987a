"""Weight transports (disk, broadcast, colocated) into real engines: after each transfer the engine's logprobs on a
probe equal the trainer's (fp32, atol 1e-4) and its weight version is the one sent; broadcast failures (an engine
that never joins, one that dies mid-update, a refused tensor) fail within the timeout naming the engine, and the
engines that did not fail keep their old weights and version."""
import asyncio
import contextlib
import json
import time

import pytest
import torch
from aiohttp import web

from slick.engines.client import HttpEngine
from slick.engine.local import LocalEngine
from slick.engines.router import free_port, launch_workers
from slick.serve.server import SlickServer
from slick.train.trainer import Trainer
from slick.weights.transport import TransportError, make_transport
from slick.weights.transport.buckets import iter_buckets, with_last
from slick.weights.transport.disk import read_marker
from slick.weights.sync import sync_weights
from slick.types import Sample, SamplingParams
from tests.test_checkpoint import _step
from tests.test_server import call
from tests.test_train import make_cfg, make_samples

pytestmark = pytest.mark.timeout(300)

PROMPT = [1, 20, 30, 40]
ATOL = 1e-4          # fp32 trainer vs fp32 engine: same weights, different kernels


@pytest.fixture(scope="module")
def trainer(tiny_model_dir):
    tr = Trainer(make_cfg(tiny_model_dir, lr=5e-2))
    for _ in range(2):
        _step(tr, make_samples(3))
    assert tr.version == 2
    return tr


def local_engine(model_dir):
    return LocalEngine(model_dir, dtype="fp32", device="cpu", max_running=2, seed=0)


@contextlib.asynccontextmanager
async def serving(engine, model_dir, api_key=None):
    """A real SlickServer (what `slick serve` runs) on a free 127.0.0.1 port in this event loop."""
    server = SlickServer(engine, model_path=str(model_dir), api_key=api_key)
    runner = web.AppRunner(server.app(), access_log=None, handler_cancellation=True)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    try:
        yield f"http://127.0.0.1:{runner.addresses[0][1]}"
    finally:
        await runner.cleanup()
        await engine.close()


async def probe(engine):
    return await engine.generate(PROMPT, SamplingParams(temperature=1.0, max_new_tokens=6, seed=3))


def assert_matches(tr, gen, atol=ATOL):
    want = tr.compute_logprobs([Sample(prompt_ids=PROMPT, response_ids=gen.token_ids)])[0]
    assert len(gen.token_ids) == 6
    torch.testing.assert_close(torch.tensor(gen.logprobs), want.float(), atol=atol, rtol=0)


def assert_differs(tr, gen):
    want = tr.compute_logprobs([Sample(prompt_ids=PROMPT, response_ids=gen.token_ids)])[0]
    assert (torch.tensor(gen.logprobs) - want).abs().max() > 1e-2


# ------------------------------------------------------------------------------ buckets (pure)
def test_buckets_respect_the_limit_and_order():
    named = [(f"t{i}", torch.zeros(n)) for i, n in enumerate([10, 10, 30, 5, 5, 5, 100])]   # fp32: 4 bytes each
    got = [[n for n, _ in b] for b in iter_buckets(named, 80)]
    assert got == [["t0", "t1"], ["t2"], ["t3", "t4", "t5"], ["t6"]]       # t6 (400 B) travels alone
    assert list(with_last("abc")) == [("a", False), ("b", False), ("c", True)] and list(with_last([])) == []
    with pytest.raises(ValueError, match="bucket_bytes"):
        list(iter_buckets(named, 0))
    with pytest.raises(ValueError, match="unknown weight transport 'tcp'"):
        make_transport("tcp")
    with pytest.raises(ValueError, match="disk_dir"):
        make_transport("disk")


# ------------------------------------------------------------------------------ disk
def test_disk_transport_to_http_engine(trainer, tiny_model_dir, tmp_path):
    async def main():
        async with serving(local_engine(tiny_model_dir), tiny_model_dir) as url:
            eng = HttpEngine([url])
            assert_differs(trainer, await probe(eng))
            tp = make_transport("disk", disk_dir=str(tmp_path / "w"), bucket_bytes=1 << 20, timeout_s=60,
                                model_dir=str(tiny_model_dir))
            await tp.connect([eng])
            await tp.send(trainer.version, trainer.named_weights())
            gen = await probe(eng)
            version = await eng.get_weight_version()
            await eng.close()
            return gen, version

    gen, version = asyncio.run(main())
    assert version == trainer.version == 2 and gen.weight_version == 2
    assert_matches(trainer, gen)
    d = tmp_path / "w"
    assert read_marker(d)["version"] == 2 and read_marker(d)["tensors"] == len(list(trainer.named_weights()))
    index = json.loads((d / "model.safetensors.index.json").read_text())
    shards = sorted(p.name for p in d.glob("*.safetensors"))
    assert len(shards) > 1 and set(index["weight_map"].values()) == set(shards)
    assert (d / "config.json").is_file() and (d / "tokenizer.json").is_file()   # a loadable HF directory


# ------------------------------------------------------------------------------ colocated
def test_colocated_transport_in_process(trainer, tiny_model_dir):
    async def main():
        eng = local_engine(tiny_model_dir)
        assert_differs(trainer, await probe(eng))
        secs = await sync_weights(trainer, [eng], "colocated")
        gen = await probe(eng)
        version = await eng.get_weight_version()
        with pytest.raises(TransportError, match="http://127.0.0.1:9 are behind HTTP"):
            await make_transport("colocated").connect([HttpEngine(["http://127.0.0.1:9"])])
        await eng.close()
        return gen, version, secs

    gen, version, secs = asyncio.run(main())
    assert secs > 0 and version == gen.weight_version == trainer.version
    assert_matches(trainer, gen)


# ------------------------------------------------------------------------------ broadcast
def test_broadcast_to_http_and_in_process_engines_twice(trainer, tiny_model_dir):
    """One group (an HTTP engine + an in-process engine, gloo), two versions sent through it in buckets."""
    async def main():
        local = local_engine(tiny_model_dir)
        async with serving(local_engine(tiny_model_dir), tiny_model_dir) as url:
            http = HttpEngine([url])
            tp = make_transport("broadcast", bucket_bytes=1 << 20, timeout_s=60)
            await tp.connect([http, local])
            results = []
            for _ in range(2):
                secs = await sync_weights(trainer, [http, local], tp)
                gens = [await probe(http), await probe(local)]
                results.append((trainer.version, secs, gens,
                                [await http.get_weight_version(), await local.get_weight_version()]))
                for g in gens:
                    assert_matches(trainer, g)
                _step(trainer, make_samples(3, seed=5))
            buckets = tp.buckets_sent
            await tp.disconnect()
            st, out = await asyncio.to_thread(call, url, "/destroy_weights_update_group", {"group_name": "x"})
            await http.close()
        await local.close()
        return results, buckets

    results, buckets = asyncio.run(main())
    n_tensors = len(list(trainer.named_weights()))
    assert buckets >= 4 and buckets < 2 * n_tensors      # several buckets per version, several tensors per bucket
    for version, secs, gens, versions in results:
        assert secs > 0 and versions == [version, version] and [g.weight_version for g in gens] == versions
    assert [r[0] for r in results] == [2, 3]


def test_broadcast_engine_that_never_joins_is_named(trainer, tiny_model_dir):
    async def main():
        async with serving(local_engine(tiny_model_dir), tiny_model_dir) as url:
            dead = f"http://127.0.0.1:{free_port()}"
            eng = HttpEngine([url], control_urls=[url, dead])
            before = await probe(eng)
            tp = make_transport("broadcast", timeout_s=5)
            t0 = time.monotonic()
            with pytest.raises(TransportError) as err:
                await tp.connect([eng])
            took = time.monotonic() - t0
            after = await probe(eng)
            st, v = await asyncio.to_thread(call, url, "/get_weight_version")
            await eng.close()
        return before, after, v["weight_version"], str(err.value), took, dead

    before, after, version, msg, took, dead = asyncio.run(main())
    assert dead in msg and "never joined" in msg and took < 5 + 5, msg
    assert version == 0 and (after.token_ids, after.logprobs) == (before.token_ids, before.logprobs)


@pytest.mark.slow
def test_broadcast_engine_dying_mid_update_is_named_and_others_keep_weights(trainer, tiny_model_dir):
    """A `slick serve` subprocess is SIGKILLed after the group formed and the first tensors went out."""
    (worker,) = launch_workers(tiny_model_dir, 1, dtype="fp32", startup_timeout=240)

    def killing(named, at):
        for i, pair in enumerate(named):
            if i == at:
                worker.proc.kill()
                worker.proc.wait(timeout=30)
            yield pair

    async def main():
        async with serving(local_engine(tiny_model_dir), tiny_model_dir) as url:
            eng = HttpEngine([url], control_urls=[url, worker.url])
            tp = make_transport("broadcast", bucket_bytes=64 << 10, timeout_s=20)
            await tp.connect([eng])
            await tp.send(1, trainer.named_weights())       # first a good update of both, across processes
            first = tp.buckets_sent
            sub = HttpEngine([worker.url])
            on_worker = await probe(sub)
            await sub.close()
            before = await probe(eng)
            t0 = time.monotonic()
            with pytest.raises(TransportError) as err:
                await tp.send(7, killing(((n, t + 0.05) for n, t in trainer.named_weights()), 6))
            took = time.monotonic() - t0
            sent = tp.buckets_sent - first
            st, v = await asyncio.to_thread(call, url, "/get_weight_version")
            after = await probe(eng)
            with pytest.raises(TransportError, match=worker.url):      # the next send reconnects: still gone
                await tp.send(8, trainer.named_weights())
            await eng.close()
        return before, after, v["weight_version"], str(err.value), took, sent, on_worker

    try:
        before, after, version, msg, took, sent, on_worker = asyncio.run(main())
    finally:
        worker.stop()
    assert f"engine {worker.url} receiving bucket" in msg and took < 20 + 10, msg
    assert on_worker.weight_version == before.weight_version == 1
    assert_matches(trainer, on_worker)
    assert_matches(trainer, before)
    assert sent >= 1                     # it died mid-update: some buckets had gone out
    assert version == 1 and (after.token_ids, after.logprobs) == (before.token_ids, before.logprobs)


def test_broadcast_refused_tensor_names_engine_and_changes_nothing(trainer, tiny_model_dir):
    """A tensor that is not a weight of the model: every engine still receives the whole bucket (no one hangs),
    then refuses the update as a whole."""
    async def main():
        async with serving(local_engine(tiny_model_dir), tiny_model_dir) as url:
            eng = HttpEngine([url])
            before = await probe(eng)
            tp = make_transport("broadcast", bucket_bytes=1 << 20, timeout_s=20)
            await tp.connect([eng])
            bad = list(trainer.named_weights()) + [("model.layers.9.bogus.weight", torch.zeros(3))]
            with pytest.raises(TransportError) as err:
                await tp.send(5, bad)
            after = await probe(eng)
            await tp.send(6, trainer.named_weights())           # the group was re-formed; a good update loads
            good = await probe(eng)
            await eng.close()
        return before, after, good, str(err.value)

    before, after, good, msg = asyncio.run(main())
    assert "model.layers.9.bogus.weight" in msg and "http://127.0.0.1:" in msg, msg
    assert after.weight_version == 0 and (after.token_ids, after.logprobs) == (before.token_ids, before.logprobs)
    assert good.weight_version == 6
    assert_matches(trainer, good)


def test_weight_group_endpoints_check_requests(tiny_model_dir):
    async def main():
        async with serving(local_engine(tiny_model_dir), tiny_model_dir, api_key="k") as url:
            auth = {"Authorization": "Bearer k"}
            out = []
            for path, body, headers in [
                ("/init_weights_update_group", {"master_address": "127.0.0.1", "master_port": 1, "rank_offset": 0,
                                                "world_size": 2}, auth),
                ("/init_weights_update_group", {"master_address": "127.0.0.1", "master_port": 1}, auth),
                ("/update_weights_from_distributed", {"names": ["a"], "dtypes": ["float32"], "shapes": [[1]]}, auth),
                ("/update_weights_from_distributed", {"names": ["a"], "dtypes": ["float32"], "shapes": [[1]]}, {}),
            ]:
                out.append(await asyncio.to_thread(call, url, path, body, headers=headers))
        return out

    (s1, o1), (s2, o2), (s3, o3), (s4, o4) = asyncio.run(main())
    assert s1 == 400 and "rank_offset 0" in o1["message"] and o1["success"] is False
    assert s2 == 400 and "missing field 'rank_offset'" in o2["message"]
    assert s3 == 400 and "no weight update group named 'weight_update_group'" in o3["message"]
    assert s4 == 401
