"""LocalEngine against Hugging Face reference models (tiny random weights, fp32)."""
import asyncio
import time

import pytest
import torch

from slick.engine.local import LocalEngine
from slick.types import SamplingParams

PROMPTS = ["Hello there, how are you doing today?", "What is 3 + 4?", "Tell me a story about a cat",
           "1 2 3 4 5 6 7 8 9 10 11 12", "x"]


def make_spiky_model(out_dir, arch, seed=0):
    """A tiny model whose weights are re-drawn with a large std so greedy outputs vary token to token
    (the default 0.02 init makes every continuation repeat one token, a weak check)."""
    from transformers import AutoModelForCausalLM

    from slick.models.tiny import make_tiny_model

    d = make_tiny_model(out_dir, arch=arch, seed=seed)
    m = AutoModelForCausalLM.from_pretrained(d, dtype=torch.float32)
    g = torch.Generator().manual_seed(seed + 1)
    with torch.no_grad():
        for name, p in m.named_parameters():
            if p.dim() >= 2:
                p.copy_(torch.randn(p.shape, generator=g) * 0.25)
            elif "bias" in name:
                p.copy_(torch.randn(p.shape, generator=g) * 0.1)
            else:
                p.copy_(1.0 + torch.randn(p.shape, generator=g) * 0.1)
    m.save_pretrained(d)
    return d, m


@pytest.fixture(scope="module")
def llama(tmp_path_factory):
    d, m = make_spiky_model(tmp_path_factory.mktemp("spiky-llama"), "llama")
    eng = LocalEngine(d, dtype="fp32", max_running=8)
    yield d, m, eng
    eng.close_sync()


def run(coro):
    return asyncio.run(asyncio.wait_for(coro, timeout=120))


def hf_greedy(m, prompt, n):
    out = m.generate(torch.tensor([prompt]), attention_mask=torch.ones(1, len(prompt), dtype=torch.long),
                     do_sample=False, max_new_tokens=n, min_new_tokens=n, pad_token_id=0)
    return out[0, len(prompt):].tolist()


def hf_logprobs(m, prompt, resp, temperature):
    ids = torch.tensor([prompt + resp])
    with torch.no_grad():
        logits = m(ids).logits[0, len(prompt) - 1:-1].float()
    lp = torch.log_softmax(logits / temperature, dim=-1)
    return lp.gather(1, torch.tensor(resp).view(-1, 1)).view(-1)


@pytest.mark.parametrize("arch", ["llama", "qwen2", "qwen3", "mistral"])
def test_greedy_matches_hf_generate(tmp_path, arch):
    d, m = make_spiky_model(tmp_path / arch, arch)
    eng = LocalEngine(d, dtype="fp32")
    try:
        for text in PROMPTS[:3]:
            prompt = eng.tokenizer.encode(text)
            ref = hf_greedy(m, prompt, 24)
            sp = SamplingParams(temperature=0, max_new_tokens=24, stop_token_ids=[])
            eng.eos_ids = []  # compare full length even if the random model emits EOS
            g = run(eng.generate(prompt, sp))
            assert g.token_ids == ref, (arch, text)
            assert len(set(ref)) > 3  # the check is not trivially one repeated token
            lp = hf_logprobs(m, prompt, g.token_ids, 1.0)
            assert torch.allclose(torch.tensor(g.logprobs), lp, atol=1e-4)
    finally:
        eng.close_sync()


@pytest.mark.parametrize("temperature", [1.0, 0.7])
def test_sampled_logprobs_match_hf_forward(llama, temperature):
    d, m, eng = llama
    prompt = eng.tokenizer.encode(PROMPTS[0])
    sp = SamplingParams(temperature=temperature, top_p=0.9, top_k=50, max_new_tokens=20, seed=7)
    g = run(eng.generate(prompt, sp))
    assert len(g.token_ids) == len(g.logprobs) > 0
    ref = hf_logprobs(m, prompt, g.token_ids, temperature)
    assert torch.allclose(torch.tensor(g.logprobs), ref, atol=1e-4), (g.logprobs, ref.tolist())


def test_staggered_continuous_batching_equals_sequential(llama):
    d, m, eng = llama
    prompts = [eng.tokenizer.encode(t) for t in PROMPTS]
    lengths = [5, 17, 9, 30, 12]

    async def one_at_a_time():
        return [await eng.generate(p, SamplingParams(temperature=0, max_new_tokens=n))
                for p, n in zip(prompts, lengths)]

    async def staggered():
        async def delayed(i):
            await asyncio.sleep(0.02 * i)
            return await eng.generate(prompts[i], SamplingParams(temperature=0, max_new_tokens=lengths[i]))
        return await asyncio.gather(*(delayed(i) for i in range(len(prompts))))

    seq = run(one_at_a_time())
    steps0 = eng.stats()["decode_steps"]
    par = run(staggered())
    steps = eng.stats()["decode_steps"] - steps0
    for a, b in zip(seq, par):
        assert a.token_ids == b.token_ids
        assert a.finish_reason == b.finish_reason
        assert torch.allclose(torch.tensor(a.logprobs), torch.tensor(b.logprobs), atol=1e-4)
    # they really overlapped: fewer decode steps than one at a time
    assert steps < sum(len(g.token_ids) for g in par)


def test_threaded_scheduler_matches_inline(llama):
    """The background-thread scheduler (default on CUDA) gives the same tokens as the inline one (CPU)."""
    d, m, eng = llama
    threaded = LocalEngine(d, dtype="fp32", max_running=8, threaded=True)
    try:
        prompts = [eng.tokenizer.encode(t) for t in PROMPTS]

        async def both(e):
            sp = SamplingParams(temperature=0.8, max_new_tokens=12, seed=7)
            return await asyncio.gather(*(e.generate(p, sp) for p in prompts))

        assert not eng.threaded and threaded.threaded
        for a, b in zip(run(both(eng)), run(both(threaded))):
            assert a.token_ids == b.token_ids
        assert run(threaded.update_weights(path=str(d), version=5)) == 5
    finally:
        threaded.close_sync()
    assert not run(threaded.health())


def test_seed_reproducible_and_shared_prefill(llama):
    d, m, eng = llama
    prompt = eng.tokenizer.encode(PROMPTS[2])
    other = eng.tokenizer.encode(PROMPTS[3])
    sp = lambda s: SamplingParams(temperature=1.0, max_new_tokens=16, seed=s)  # noqa: E731
    alone = run(eng.generate(prompt, sp(123)))

    async def crowd():
        return await asyncio.gather(eng.generate(other, sp(5)), eng.generate(prompt, sp(123)),
                                    *(eng.generate(prompt, sp(1000 + i)) for i in range(4)))

    before = eng.stats()["prefills"]
    res = run(crowd())
    after = eng.stats()["prefills"]
    assert res[1].token_ids == alone.token_ids
    assert len({tuple(r.token_ids) for r in res[1:]}) > 1          # different seeds differ
    assert after - before == 2       # 5 copies of one prompt share a prefill; the other prompt has its own


def test_top_k_one_is_greedy_and_stops(llama):
    d, m, eng = llama
    prompt = eng.tokenizer.encode(PROMPTS[0])
    greedy = run(eng.generate(prompt, SamplingParams(temperature=0, max_new_tokens=20)))
    k1 = run(eng.generate(prompt, SamplingParams(temperature=1.3, top_k=1, max_new_tokens=20)))
    assert k1.token_ids == greedy.token_ids
    assert greedy.finish_reason == "length" and len(greedy.token_ids) == 20
    # stop token id: the 5th greedy token ends the request, and stays in the output
    stop_tok = greedy.token_ids[4]
    first = greedy.token_ids.index(stop_tok)
    g = run(eng.generate(prompt, SamplingParams(temperature=0, max_new_tokens=20, stop_token_ids=[stop_tok])))
    assert g.finish_reason == "stop" and g.token_ids == greedy.token_ids[:first + 1]
    # stop string: text of the greedy continuation after a few tokens
    text = eng.tokenizer.decode(greedy.token_ids)
    s = eng.tokenizer.decode(greedy.token_ids[6:8]).strip()
    assert s
    g = run(eng.generate(prompt, SamplingParams(temperature=0, max_new_tokens=20, stop=[s])))
    assert g.finish_reason == "stop" and len(g.token_ids) <= 8
    assert s in g.text and g.token_ids == greedy.token_ids[:len(g.token_ids)]
    assert text.startswith(g.text)
    # max_new_tokens capped by the context
    eng2 = LocalEngine(d, dtype="fp32", max_seq_len=len(prompt) + 3)
    try:
        g = run(eng2.generate(prompt, SamplingParams(temperature=0, max_new_tokens=50)))
        assert g.finish_reason == "length" and g.token_ids == greedy.token_ids[:3]
        with pytest.raises(ValueError, match="context limit"):
            run(eng2.generate(prompt + prompt, SamplingParams()))
    finally:
        eng2.close_sync()


def test_abort_all_returns_partial_output(llama):
    d, m, eng = llama
    prompts = [eng.tokenizer.encode(t) for t in PROMPTS[:3]]

    async def go():
        tasks = [asyncio.ensure_future(eng.generate(p, SamplingParams(temperature=0, max_new_tokens=1500)))
                 for p in prompts]
        t0 = time.monotonic()
        while eng.stats()["running"] < 3 or min(len(r.out) for r in eng._running) < 3:
            assert time.monotonic() - t0 < 30
            await asyncio.sleep(0.005)
        await eng.abort_all()
        return await asyncio.gather(*tasks)

    res = run(go())
    for g in res:
        assert g.finish_reason == "abort"
        assert 3 <= len(g.token_ids) < 1500 and len(g.logprobs) == len(g.token_ids)
    assert eng.stats()["running"] == 0 and eng.stats()["queued"] == 0
    # still usable afterwards
    assert run(eng.generate(prompts[0], SamplingParams(temperature=0, max_new_tokens=2))).finish_reason == "length"


def test_update_weights_named_and_from_dir(tmp_path, llama):
    d, m, _ = llama
    eng = LocalEngine(d, dtype="fp32")
    try:
        prompt = eng.tokenizer.encode(PROMPTS[1])
        sp = SamplingParams(temperature=0, max_new_tokens=12)
        before = run(eng.generate(prompt, sp))
        assert before.weight_version == 0
        d2, m2 = make_spiky_model(tmp_path / "other", "llama", seed=5)
        v = run(eng.update_weights(named_tensors=m2.state_dict().items()))
        assert v == 1 == run(eng.get_weight_version())
        after = run(eng.generate(prompt, sp))
        assert after.weight_version == 1
        assert after.token_ids == hf_greedy(m2, prompt, 12) != before.token_ids
        v = run(eng.update_weights(path=str(d), version=10))
        assert v == 10
        back = run(eng.generate(prompt, sp))
        assert back.token_ids == before.token_ids and back.weight_version == 10
        with pytest.raises(ValueError, match="'model.nope.weight' is not a weight of this model"):
            run(eng.update_weights(named_tensors=[("model.nope.weight", torch.zeros(1))]))
        with pytest.raises(ValueError, match="shape"):
            run(eng.update_weights(named_tensors=[("model.norm.weight", torch.zeros(3))]))
    finally:
        eng.close_sync()


@pytest.mark.parametrize("threaded", [False, True], ids=["inline", "threaded"])
def test_failed_update_changes_nothing(tmp_path, llama, threaded):
    """A bad update (valid tensors first, then a defect) leaves weights and version exactly as they were."""
    from slick.engine.weight_check import WeightUpdateError
    from tests.bad_weights import BAD_DIRS

    d, _, _ = llama
    eng = LocalEngine(d, dtype="fp32", threaded=threaded)
    try:
        prompt = eng.tokenizer.encode(PROMPTS[0])
        sp = SamplingParams(temperature=0, max_new_tokens=10)
        before = run(eng.generate(prompt, sp))
        other, m2 = make_spiky_model(tmp_path / "other", "llama", seed=7)
        pairs = list(m2.state_dict().items())
        bad_named = [
            (pairs + [("model.norm.weight", torch.zeros(3))], "shape \\[3\\]"),
            (pairs + [("model.layers.0.nope.weight", torch.zeros(2))], "'model.layers.0.nope.weight' is not"),
            (pairs + [("model.norm.weight", torch.ones(64, dtype=torch.int64))], "torch.int64"),
        ]
        for named, msg in bad_named:
            with pytest.raises(WeightUpdateError, match=msg):
                run(eng.update_weights(named_tensors=named))
        for name, build, words in BAD_DIRS:
            with pytest.raises(WeightUpdateError) as e:
                run(eng.update_weights(path=str(build(other, tmp_path / name.replace(" ", "_")))))
            assert all(w in str(e.value) for w in words), (name, str(e.value))
        assert run(eng.get_weight_version()) == 0
        after = run(eng.generate(prompt, sp))
        assert after.token_ids == before.token_ids and after.logprobs == before.logprobs
        # the same tensors without the defect do load, and change the output
        assert run(eng.update_weights(named_tensors=pairs)) == 1
        assert run(eng.generate(prompt, sp)).token_ids != before.token_ids
    finally:
        eng.close_sync()


def test_many_event_loops_health_stats_and_bad_input(llama):
    d, m, eng = llama
    prompt = eng.tokenizer.encode(PROMPTS[4])
    for _ in range(3):  # a fresh event loop each time
        assert run(eng.health())
        assert len(run(eng.generate(prompt, SamplingParams(max_new_tokens=3))).token_ids) >= 1
    st = eng.stats()
    for key in ("running", "queued", "generated_tokens_total", "tokens_per_sec"):
        assert key in st
    assert st["generated_tokens_total"] > 0
    with pytest.raises(ValueError, match="outside"):
        run(eng.generate([eng.vocab_size + 1], SamplingParams()))
    with pytest.raises(ValueError, match="empty"):
        run(eng.generate([], SamplingParams()))


def test_rejects_unsupported_config(tmp_path, llama):
    import json
    import shutil

    d, m, _ = llama
    bad = tmp_path / "bad"
    shutil.copytree(d, bad)
    cfg = json.loads((bad / "config.json").read_text())
    cfg["rope_parameters"] = {"rope_type": "yarn", "rope_theta": 10000.0, "factor": 4.0}
    (bad / "config.json").write_text(json.dumps(cfg))
    with pytest.raises(ValueError, match="rope"):
        LocalEngine(bad)
    cfg["model_type"] = "gpt2"
    (bad / "config.json").write_text(json.dumps(cfg))
    with pytest.raises(ValueError, match="model_type"):
        LocalEngine(bad)


@pytest.mark.slow
def test_smollm2_greedy_matches_hf(smollm2_dir):
    from transformers import AutoModelForCausalLM

    eng = LocalEngine(smollm2_dir, dtype="fp32")
    try:
        m = AutoModelForCausalLM.from_pretrained(smollm2_dir, dtype=torch.float32)
        msgs = [{"role": "user", "content": "What is 12 + 30? Answer briefly."}]
        prompt = eng.tokenizer.apply_chat_template(msgs, add_generation_prompt=True, tokenize=True)
        if not isinstance(prompt, list):
            prompt = prompt["input_ids"]
        out = m.generate(torch.tensor([prompt]), do_sample=False, max_new_tokens=24)[0, len(prompt):].tolist()
        g = run(eng.generate(prompt, SamplingParams(temperature=0, max_new_tokens=24)))
        assert g.token_ids == out
        assert g.finish_reason == ("stop" if out[-1] in eng.eos_ids else "length")
    finally:
        eng.close_sync()


def test_kv_cache_grows_while_sequences_run(tmp_path, llama):
    d, m, _ = llama
    eng = LocalEngine(d, dtype="fp32", max_running=2)
    try:
        p1, p2, p3 = (eng.tokenizer.encode(t) for t in PROMPTS[:3])
        sp = lambda n: SamplingParams(temperature=0, max_new_tokens=n)  # noqa: E731
        ref = [hf_greedy(m, p, n) for p, n in ((p1, 40), (p2, 150), (p3, 10))]

        async def go():
            t1 = asyncio.ensure_future(eng.generate(p1, sp(40)))
            t0 = time.monotonic()
            while not eng._running or len(eng._running[0].out) < 5:
                assert time.monotonic() - t0 < 30
                await asyncio.sleep(0.002)
            cap = eng.cache.capacity
            # a longer request (more positions) and a third one (queued: only 2 slots) join mid-flight
            rest = await asyncio.gather(eng.generate(p2, sp(150)), eng.generate(p3, sp(10)))
            return cap, [await t1] + list(rest)

        cap, res = run(go())
        assert eng.cache.capacity > cap and eng.cache.slots <= 2
        for g, r in zip(res, ref):
            assert g.token_ids == r
    finally:
        eng.close_sync()


def test_shared_prompt_prefix_is_computed_once(llama):
    """Prompts admitted together with a common prefix (a system prompt) prefill it once; outputs are unchanged."""
    d, m, eng = llama
    head = eng.tokenizer.encode("You are a careful assistant. Answer every question briefly and exactly.")
    prompts = [head + eng.tokenizer.encode(t) for t in PROMPTS[:3]]
    prompts.append(prompts[0][:len(head) + 1])          # a prompt that is the prefix plus one token
    n = 10

    async def together():
        sp = SamplingParams(temperature=0, max_new_tokens=n, stop_token_ids=[])
        return await asyncio.gather(*(eng.generate(p, sp) for p in prompts))

    eos, eng.eos_ids = eng.eos_ids, []
    try:
        before = eng.stats()
        outs = run(together())
        after = eng.stats()
    finally:
        eng.eos_ids = eos
    assert after["prefix_reused_tokens"] - before["prefix_reused_tokens"] == len(head) * (len(prompts) - 1)
    for p, g in zip(prompts, outs):
        assert g.token_ids == hf_greedy(m, p, n)
        assert torch.allclose(torch.tensor(g.logprobs), hf_logprobs(m, p, g.token_ids, 1.0), atol=1e-4)


@pytest.mark.parametrize("update_between", [False, True])
def test_prompt_of_a_running_request_is_not_prefilled_again(llama, tmp_path, update_between):
    """A request admitted while another with the same prompt runs copies that one's KV and logits (no prefill);
    after a weight update the running request's KV is of the old weights, so the prompt is prefilled afresh.
    Greedy outputs equal HF's for the weights they were generated with."""
    d, m, eng = llama
    new_dir, new_m = make_spiky_model(tmp_path / "other", "llama", seed=7) if update_between else (d, m)
    prompt, n = eng.tokenizer.encode(PROMPTS[0]), 12
    sp = SamplingParams(temperature=0, max_new_tokens=n, stop_token_ids=[])

    async def late_pair():
        first = asyncio.ensure_future(eng.generate(prompt, sp, rid="first"))
        while len((eng.partial("first") or ([],))[0]) < 3:
            await asyncio.sleep(0)
        if update_between:
            eng.update_weights_sync(path=str(new_dir))
        before = eng.stats()
        later = await asyncio.gather(eng.generate(prompt, sp), eng.generate(prompt, sp))
        return before, eng.stats(), [await first, *later]

    eos, eng.eos_ids = eng.eos_ids, []
    try:
        before, after, outs = run(late_pair())
    finally:
        eng.eos_ids = eos
        eng.update_weights_sync(path=str(d))
    reused = after["prompt_reused_tokens"] - before["prompt_reused_tokens"]
    prefills = after["prefills"] - before["prefills"]
    assert (reused, prefills) == ((0, 1) if update_between else (2 * len(prompt), 0))
    want = hf_greedy(new_m, prompt, n)
    assert hf_greedy(m, prompt, n) != want or not update_between
    for g in outs[1:]:
        assert g.token_ids == want
        assert torch.allclose(torch.tensor(g.logprobs), hf_logprobs(new_m, prompt, g.token_ids, 1.0), atol=1e-4)


def test_running_requests_keep_only_their_own_prompt_logits(llama):
    """What a running request keeps for prompt reuse is its own [vocab] row, not a view that would keep its whole
    admission chunk's logits alive."""
    d, m, eng = llama
    prompts = [eng.tokenizer.encode(t) for t in PROMPTS[:3]]
    sp = SamplingParams(temperature=0, max_new_tokens=8, stop_token_ids=[])

    async def peek():
        tasks = [asyncio.ensure_future(eng.generate(p, sp, rid=f"own-{i}")) for i, p in enumerate(prompts)]
        while len((eng.partial("own-0") or ([],))[0]) < 2:
            await asyncio.sleep(0)
        kept = [r.prompt_logits for r in eng._running]
        await asyncio.gather(*tasks)
        return kept

    eos, eng.eos_ids = eng.eos_ids, []
    try:
        kept = run(peek())
    finally:
        eng.eos_ids = eos
    assert len(kept) == 3
    for t in kept:
        assert t.shape == (eng.vocab_size,)
        assert t.untyped_storage().nbytes() == eng.vocab_size * t.element_size()
