"""Issue 30, findings 7 and 8 (engine side), against a real `slick serve` subprocess on 127.0.0.1.

Finding 7: the weight-group endpoints. A caller acting as rank 0 cannot make the server allocate tensors of its
choosing (names, shapes and dtypes are held to the model before any buffer exists), ``timeout_s`` is bounded
(400 naming the field, never 500), and a member whose sender never broadcasts delays no other update.
Finding 8: the sampling settings of every choice of a request are checked before any choice starts, one choice
failing stops the others, and a temperature that underflows samples greedily with finite logprobs (the answer is
strict JSON: no ``-Infinity``).
"""
import asyncio
import datetime
import json
import math
import threading
import time
import urllib.error
import urllib.request
from pathlib import Path

import pytest
import torch

from slick.engines.router import free_port
from tests.test_server import call

pytestmark = pytest.mark.timeout(300)

PROMPT = [1, 422, 2014, 314, 253, 1232, 30]
EMBED = "model.embed_tokens.weight"


@pytest.fixture(scope="module")
def shapes(tiny_model_dir):
    from safetensors import safe_open

    out = {}
    for f in sorted(Path(tiny_model_dir).glob("*.safetensors")):
        with safe_open(str(f), framework="pt") as h:
            out.update({k: list(h.get_slice(k).get_shape()) for k in h.keys()})
    return out


def _refuse(name):
    raise ValueError(f"not JSON: {name}")


def strict_call(url, path, body):
    """POST ``body``; returns (status, the answer parsed by a JSON parser that refuses NaN and Infinity)."""
    req = urllib.request.Request(url + path, data=json.dumps(body).encode(), method="POST",
                                 headers={"Content-Type": "application/json"})
    try:
        with urllib.request.urlopen(req, timeout=60) as r:
            status, text = r.status, r.read().decode()
    except urllib.error.HTTPError as e:
        status, text = e.code, e.read().decode()
    return status, json.loads(text, parse_constant=_refuse)


def engine_state(url):
    st, info = call(url, "/get_server_info")
    assert st == 200, info
    return info["internal_states"][0], info["inflight_tokens"]


# ------------------------------------------------------------------------------------------ finding 8
def test_openai_seed_overflow_in_one_choice_starts_no_choice(server):
    before, _ = engine_state(server.url)
    st, out = call(server.url, "/v1/completions", {"prompt": PROMPT, "n": 64, "seed": 2**64 - 10, "max_tokens": 64,
                                                   "temperature": 1.0})
    after, inflight = engine_state(server.url)
    assert st == 400, out
    assert "choice[10].seed must be in [-9223372036854775808, 18446744073709551615]" in out["error"]["message"]
    assert (after["running"], after["queued"], inflight) == (0, 0, {})
    assert after["prefills"] == before["prefills"]                    # not one choice started
    assert after["generated_tokens_total"] == before["generated_tokens_total"]


def test_generate_batch_with_one_bad_seed_starts_nothing(server):
    before, _ = engine_state(server.url)
    sps = [{"max_new_tokens": 32, "temperature": 1.0, "sampling_seed": s} for s in (1, 2, 3, 2**64)]
    st, out = call(server.url, "/generate", {"input_ids": [PROMPT] * 4, "sampling_params": sps})
    after, inflight = engine_state(server.url)
    assert st == 400, out
    assert "sampling_params[3].seed must be in [" in out["error"]
    assert (after["running"], after["queued"], inflight) == (0, 0, {})
    assert after["prefills"] == before["prefills"]


def test_one_failing_choice_stops_the_others_in_the_engine(tiny_model_dir):
    from slick.serve.fanout import run_together
    from slick.engine.local import LocalEngine
    from slick.types import SamplingParams

    async def main():
        eng = LocalEngine(tiny_model_dir, dtype="fp32", device="cpu", max_running=4, seed=0)
        sp = SamplingParams(temperature=1.0, max_new_tokens=1500, ignore_eos=True)

        async def failing():
            while sum(eng.progress().values()) < 8:       # both others are really generating
                await asyncio.sleep(0.005)
            raise RuntimeError("choice 2 failed")

        rids = ["a", "b"]
        try:
            with pytest.raises(RuntimeError, match="choice 2 failed"):
                await run_together([eng.generate(PROMPT, sp, rid="a"), eng.generate(PROMPT, sp, rid="b"), failing()],
                                   stop=lambda i: eng.abort(rids[i]))
            st = eng.stats()
            return st["running"], st["queued"], eng.progress(), st["aborted"], st["generated_tokens_total"]
        finally:
            await eng.close()

    running, queued, progress, aborted, tokens = asyncio.run(main())
    assert (running, queued, progress, aborted) == (0, 0, {}, 2)
    assert tokens < 2 * 1500


@pytest.mark.parametrize("temperature", [1e-45, 1e-30, 1e-6])
def test_underflowing_temperature_is_greedy_with_finite_logprobs(server, temperature):
    body = {"input_ids": PROMPT, "return_logprob": True, "sampling_params": {"max_new_tokens": 8, "sampling_seed": 1}}
    st, greedy = strict_call(server.url, "/generate", {**body, "sampling_params": {
        **body["sampling_params"], "temperature": 0}})
    assert st == 200, greedy
    st, out = strict_call(server.url, "/generate", {**body, "sampling_params": {
        **body["sampling_params"], "temperature": temperature}})
    assert st == 200, out
    assert out["output_ids"] == greedy["output_ids"] and len(out["output_ids"]) == 8
    lps = [x[0] for x in out["meta_info"]["output_token_logprobs"]]
    assert lps == [x[0] for x in greedy["meta_info"]["output_token_logprobs"]]
    assert all(math.isfinite(x) and x <= 0 for x in lps)
    st, oa = strict_call(server.url, "/v1/completions", {"prompt": PROMPT, "max_tokens": 8, "temperature": temperature,
                                                         "logprobs": 0})
    assert st == 200, oa
    got = oa["choices"][0]["logprobs"]["token_logprobs"]
    assert len(got) >= 7 and got == lps[:len(got)]     # (a stop token is not in an OpenAI answer's logprobs)


def test_sample_never_returns_infinite_logprobs_on_either_path():
    from slick.engine import native
    from slick.engine.sampling import GREEDY_BELOW, sample

    logits = torch.randn(4, 300, generator=torch.Generator().manual_seed(0)) * 20
    temps = [1e-45, GREEDY_BELOW / 2, GREEDY_BELOW, 1e300]
    kernels = [None] + ([native.load()] if native.load() is not None else [])
    for k in kernels:
        gens = [torch.Generator().manual_seed(i) for i in range(4)]
        tok, lps = sample(logits, temps, [1.0] * 4, [-1] * 4, gens, native=k)
        assert all(math.isfinite(x) and x <= 0 for x in lps), (k, lps)
        ref = torch.log_softmax(logits, -1)
        for row in (0, 1):                                  # below GREEDY_BELOW: greedy, logprob at T = 1
            assert tok[row] == int(logits[row].argmax())
            assert lps[row] == pytest.approx(float(ref[row, tok[row]]), abs=1e-4)


def test_validate_sampling_names_the_field():
    from slick.engine.sampling import SamplingError, validate_sampling
    from slick.types import SamplingParams

    assert validate_sampling(SamplingParams(seed=2**64 - 1)).seed == 2**64 - 1
    for kw, field in [({"seed": 2**64}, "seed"), ({"seed": -2**63 - 1}, "seed"),
                      ({"temperature": math.nan}, "temperature"), ({"temperature": -1.0}, "temperature"),
                      ({"top_p": 0.0}, "top_p"), ({"top_p": math.inf}, "top_p"),
                      ({"max_new_tokens": -1}, "max_new_tokens"), ({"top_k": 1.5}, "top_k"),
                      ({"stop": "x"}, "stop"), ({"stop_token_ids": [1.0]}, "stop_token_ids")]:
        with pytest.raises(SamplingError) as err:
            validate_sampling(SamplingParams(**kw), "choice[3]")
        assert err.value.field == f"choice[3].{field}" and str(err.value).startswith(f"choice[3].{field} must")


# ------------------------------------------------------------------------------------------ finding 7
def _init_body(port, timeout_s, group="g"):
    return {"master_address": "127.0.0.1", "master_port": port, "rank_offset": 1, "world_size": 2,
            "group_name": group, "timeout_s": timeout_s}


@pytest.mark.parametrize("timeout_s", [1e15, 3600.5, 0, -1, 10**400])
def test_init_timeout_out_of_range_is_400_naming_the_field(server, timeout_s):
    t0 = time.monotonic()
    st, out = call(server.url, "/init_weights_update_group", _init_body(free_port(), timeout_s), timeout=30)
    assert st == 400, out
    assert "timeout_s" in out["message"] and out["success"] is False
    if timeout_s != 10**400:
        assert "timeout_s must be a finite number of seconds in (0, 3600]" in out["message"]
    else:
        assert "field 'timeout_s' is out of range" in out["message"]
    assert time.monotonic() - t0 < 5                 # refused before any connection attempt


class Rank0:
    """This test process as the sender (rank 0) of a gloo group with the server as rank 1."""

    def __init__(self, url, timeout_s, group):
        from torch.distributed import PrefixStore, TCPStore

        from slick.engine.weight_group import make_group

        self.url, self.group = url, group
        port = free_port()
        self.store = TCPStore("127.0.0.1", port, None, True, datetime.timedelta(seconds=30), wait_for_workers=False)
        box = {}
        th = threading.Thread(target=lambda: box.update(pg=make_group(
            "gloo", PrefixStore(group, self.store), 0, 2, timeout_s, "127.0.0.1")))
        th.start()
        st, out = call(url, "/init_weights_update_group", _init_body(port, timeout_s, group))
        th.join(30)
        assert st == 200, out
        self.pg = box["pg"]

    def update(self, names, dtypes, shapes, last=True, send=None):
        """POST a bucket while broadcasting ``send`` (tensors; None: broadcast nothing). Returns (status, out, s)."""
        body = {"names": names, "dtypes": dtypes, "shapes": shapes, "group_name": self.group, "last_bucket": last}
        res = {}
        th = threading.Thread(target=lambda: res.update(r=call(self.url, "/update_weights_from_distributed", body)))
        t0 = time.monotonic()
        th.start()
        for t in send or ():
            self.pg.broadcast(t, 0).wait()
        th.join(60)
        return (*res["r"], time.monotonic() - t0)

    def close(self):
        call(self.url, "/destroy_weights_update_group", {"group_name": self.group})
        self.pg = self.store = None


@pytest.mark.parametrize("names,dtypes,bad_shapes,words", [
    ([EMBED], ["float32"], [[8192, 8192]], [EMBED, "has shape [8192, 8192]; the model's is"]),
    (["bogus.weight"], ["float32"], [[8192, 8192]], ["'bogus.weight' is not a weight of this model"]),
    ([EMBED], ["float64"], None, [EMBED, "dtype float64 is not accepted"]),
    ([EMBED, EMBED], ["float32", "float32"], None, [EMBED, "announced twice"]),
], ids=["shape", "name", "dtype", "twice"])
def test_bucket_not_matching_the_model_is_refused_before_receiving(server, shapes, names, dtypes, bad_shapes, words):
    r0 = Rank0(server.url, 20, "g-check")
    try:
        st, out, took = r0.update(names, dtypes, bad_shapes or [shapes[n] for n in names], last=False)
        st2, out2 = call(server.url, "/update_weights_from_distributed", {
            "names": [EMBED], "dtypes": ["float32"], "shapes": [shapes[EMBED]], "group_name": "g-check"})
    finally:
        r0.close()
    assert st == 400 and all(w in out["message"] for w in words), out
    assert took < 10                                  # refused at once, not after waiting for a broadcast
    assert st2 == 400 and "no weight update group named 'g-check'" in out2["message"]   # the group was dropped


def test_a_name_staged_once_cannot_be_staged_again(server, shapes):
    r0 = Rank0(server.url, 20, "g-twice")
    try:
        t = torch.zeros(shapes[EMBED])
        first = r0.update([EMBED], ["float32"], [shapes[EMBED]], last=False, send=[t])
        second = r0.update([EMBED], ["float32"], [shapes[EMBED]], last=False)
    finally:
        r0.close()
    assert first[0] == 200 and first[1]["staged"] == 1, first
    assert second[0] == 400 and f"{EMBED!r} is announced twice" in second[1]["message"], second


def test_sender_that_never_broadcasts_delays_no_other_update(server, shapes, tiny_model_dir):
    v0 = call(server.url, "/get_weight_version")[1]["weight_version"]
    r0 = Rank0(server.url, 4, "g-silent")
    res = {}

    def stuck():
        res["r"] = r0.update([EMBED], ["float32"], [shapes[EMBED]], last=True)   # announced, never broadcast

    th = threading.Thread(target=stuck)
    try:
        th.start()
        time.sleep(0.5)                                     # the server is now waiting for the broadcast
        t0 = time.monotonic()
        st, out = call(server.url, "/update_weights_from_disk", {"model_path": str(tiny_model_dir)})
        took = time.monotonic() - t0
        th.join(30)
    finally:
        r0.close()
    assert st == 200 and out["weight_version"] == v0 + 1, out
    assert took < 2.0                                       # did not wait for the silent group (4 s)
    s_st, s_out, s_took = res["r"]
    assert s_st == 400 and "receiving 'model.embed_tokens.weight' from rank 0 failed" in s_out["message"], s_out
    assert 3.0 < s_took < 4 + 6                             # timed out by its own bound
    assert call(server.url, "/get_weight_version")[1]["weight_version"] == v0 + 1


def test_max_timeout_is_the_engines_and_staging_is_bounded_by_the_model(tiny_model_dir):
    from slick.engine.local import LocalEngine
    from slick.engine.weight_group import WeightGroupError, WeightGroups
    from slick.engine.weight_staging import SLACK_BYTES, StagingBudget, StagingError, budget_bytes

    eng = LocalEngine(tiny_model_dir, dtype="fp32", device="cpu", max_running=1)
    try:
        groups = WeightGroups(eng, max_timeout_s=2)
        for bad in (3, 2.0000001, math.nan, math.inf, -math.inf):     # (NaN/Infinity: what json.loads reads)
            with pytest.raises(WeightGroupError, match=r"timeout_s must be a finite number of seconds in \(0, 2\]"):
                groups.init_sync(_init_body(free_port(), bad))
        numel = sum(math.prod(s) for s in eng.weight_shapes().values())
        assert numel > 10**6 and eng.weight_shapes()[EMBED] == (49152, 64)
        assert groups.budget.limit == budget_bytes(eng.weight_shapes()) == 4 * numel + SLACK_BYTES
    finally:
        eng.close_sync()

    b = StagingBudget(100)
    b.reserve("a", 60, idle=lambda: [], drop=b.release)
    b.reserve("b", 60, idle=lambda: ["a"], drop=b.release)          # a was idle: dropped for b
    assert b.held == {"b": 60}
    with pytest.raises(StagingError, match=r"weight groups \['b'\] are receiving 60 bytes"):
        b.reserve("c", 50, idle=lambda: [], drop=b.release)
    with pytest.raises(StagingError, match="announces 101 bytes; the engine takes at most 100"):
        b.reserve("c", 101, idle=lambda: ["b"], drop=b.release)
    assert b.held == {"b": 60}
