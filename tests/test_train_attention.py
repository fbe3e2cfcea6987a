"""Segment attention (slick.train.attention) equals the dense-mask path; the trainer's cast cache."""

import pytest
import torch

from slick.train.attention import Segments
from slick.train.casts import cached_weight_casts
from slick.train.casts import cast as _cast
from slick.train.packing import pack, pack_shared_prompts
from slick.train.trainer import Trainer
from tests.test_train import make_cfg, make_samples
from tests.test_train_shared_prompts import grouped_samples
from tests.batches import batch_of


def test_segment_indices_by_hand():
    # rows 0-2: a prompt; rows 3-4: a response that sees the prompt; rows 5-6: a sample of its own
    seg = Segments.build([(0, 0, 0, 3), (0, 3, 3, 5), (5, 0, 5, 7)], 7)
    assert seg.q_index.tolist() == [[0, 1, 2], [3, 4, 0], [5, 6, 0]]
    assert seg.k_index.tolist() == [[0, 1, 2, 0, 0], [0, 1, 2, 3, 4], [5, 6, 0, 0, 0]]
    assert seg.out_index.tolist() == [0, 1, 2, 3, 4, 6, 7]
    m = seg.mask[:, 0].int().tolist()
    assert m[0] == [[1, 0, 0, 0, 0], [1, 1, 0, 0, 0], [1, 1, 1, 0, 0]]
    assert m[1] == [[1, 1, 1, 1, 0], [1, 1, 1, 1, 1], [1, 0, 0, 0, 0]]   # last row: padding, one key
    assert m[2] == [[1, 0, 0, 0, 0], [1, 1, 0, 0, 0], [1, 0, 0, 0, 0]]
    assert seg.cost == 3 * 3 * 5
    d = seg.dense_mask()[0, 0].int().tolist()
    assert d[4] == [1, 1, 1, 1, 1, 0, 0] and d[6] == [0, 0, 0, 0, 0, 1, 1] and d[1] == [1, 1, 0, 0, 0, 0, 0]
    with pytest.raises(ValueError, match="uncovered"):
        Segments.build([(0, 0, 0, 3)], 5)


def _pattern(seg: Segments) -> torch.Tensor:
    """The [n, n] attention pattern the blocks compute (each real query row: the rows of its unmasked keys)."""
    Lq, Lk = seg.q_index.shape[1], seg.k_index.shape[1]
    m = torch.zeros(seg.n, seg.n, dtype=torch.bool)
    mask, keys = seg.mask[:, 0].reshape(-1, Lk), seg.k_index
    for slot in seg.out_index.tolist():
        m[seg.q_index.reshape(-1)[slot], keys[slot // Lq][mask[slot]]] = True
    return m


def test_long_segments_are_cut_into_query_blocks():
    """Rows 0-17: an 18-token prompt; 3 responses of 8 tokens see it. Whole segments: 4 blocks x (18 query rows
    + 1) x 26 keys = 1,976; in blocks of 8 (the prompt's at prefixes 0, 8, 16): 6 x 9 x 26 = 1,404; the same
    pattern as the dense mask."""
    spans = [(0, 0, 0, 18), (0, 18, 18, 26), (0, 18, 26, 34), (0, 18, 34, 42)]
    seg = Segments.build(spans, 42)
    assert seg.spans == spans and seg.q_index.shape == (6, 8) and seg.k_index.shape == (6, 26)
    assert seg.q_index[2, :2].tolist() == [16, 17] and seg.q_index[2, 2:].tolist() == [0] * 6   # padding slots
    assert seg.k_index[1, :16].tolist() == list(range(16))
    assert seg.mask[1, 0, 0].int().tolist()[:10] == [1] * 9 + [0]       # row 8: rows 0-8
    assert seg.out_index[:18].tolist() == list(range(8)) + list(range(8, 16)) + [16, 17]
    assert torch.equal(_pattern(seg), seg.dense_mask()[0, 0])


def test_a_long_response_is_cut_and_keeps_its_prompt():
    """An 8-token prompt, a 24-token response and two of 8: the long response goes in 3 blocks, each seeing
    the whole prompt and its own rows up to itself (6 x 9 x 32 = 1,728 vs 4 x 25 x 32 = 3,200 whole)."""
    spans = [(0, 0, 0, 8), (0, 8, 8, 32), (0, 8, 32, 40), (0, 8, 40, 48)]
    seg = Segments.build(spans, 48)
    assert seg.q_index.shape == (6, 8) and seg.k_index.shape == (6, 32)
    assert seg.q_index[2].tolist() == list(range(16, 24))                 # second block of the long response
    assert seg.k_index[2, :24].tolist() == list(range(24))                 # prompt 0-7, then rows 8-23
    assert seg.mask[2, 0, 0].int().tolist()[:18] == [1] * 17 + [0]        # row 16: prompt + rows 8-16
    assert torch.equal(_pattern(seg), seg.dense_mask()[0, 0])
    # a cut that saves under a quarter is not made; nor blocks under MIN_BLOCK rows
    assert Segments.build([(0, 0, 0, 3), (0, 3, 3, 5), (5, 0, 5, 7)], 7).q_index.shape == (3, 3)


def test_worth_it_prefers_the_dense_mask_for_one_long_sequence():
    assert not Segments.build([(0, 0, 0, 100)], 100).worth_it()          # 100x100 either way
    assert Segments.build([(i * 10, 0, i * 10, i * 10 + 10) for i in range(10)], 100).worth_it()


def _grads_and_logprobs(trainer, samples, dense: bool):
    mb = (pack_shared_prompts if samples[0].prompt_ids == samples[1].prompt_ids else pack)(
        samples, list(range(len(samples))))
    attention = (mb.segments.dense_mask(), None) if dense else (mb.segments.mask, mb.segments)
    trainer.model.zero_grad(set_to_none=True)
    lp, ent = trainer._fwd(mb.input_ids, mb.position_ids, attention, mb.gather_index, mb.targets, 1.0, 64, True, True)
    (lp.sum() + 0.1 * ent.sum()).backward()
    grads = {n: p.grad.clone() for n, p in trainer.model.named_parameters() if p.grad is not None}
    return lp.detach(), ent.detach(), grads


def long_prompt_samples():
    """Two groups of 4 responses to 20-token prompts; responses of 9 tokens but one of 26: prompts and the
    long response are cut into blocks."""
    samples = grouped_samples(groups=2, n=4, seed=3)
    for g in range(2):
        prompt = [(7 * i + 13 * g) % 900 + 3 for i in range(20)]
        for k, s in enumerate(samples[4 * g:4 * g + 4]):
            s.prompt_ids = list(prompt)
            s.response_ids = [(11 * i + 5 * k + g) % 900 + 3 for i in range(26 if (g, k) == (1, 2) else 9)]
            s.loss_mask, s.rollout_logprobs = [1] * len(s.response_ids), [-1.0] * len(s.response_ids)
    return samples


@pytest.mark.parametrize("layout", ["plain", "shared", "long_prompt"])
def test_segments_equal_dense_mask_logprobs_and_gradients(tiny_model_dir, layout):
    tr = Trainer(make_cfg(tiny_model_dir))
    assert tr.model.config.num_key_value_heads < tr.model.config.num_attention_heads   # GQA is exercised
    samples = {"plain": lambda: make_samples(6, seed=3), "shared": lambda: grouped_samples(groups=2, n=4, seed=3),
               "long_prompt": long_prompt_samples}[layout]()
    if layout == "long_prompt":
        seg = pack_shared_prompts(samples, list(range(len(samples)))).segments
        assert len(seg.spans) == 10 and seg.q_index.shape == (17, 8), seg.q_index.shape   # the long one: 4
    lp_s, ent_s, g_s = _grads_and_logprobs(tr, samples, dense=False)
    lp_d, ent_d, g_d = _grads_and_logprobs(tr, samples, dense=True)
    assert torch.allclose(lp_s, lp_d, atol=1e-5, rtol=0), (lp_s - lp_d).abs().max()
    assert torch.allclose(ent_s, ent_d, atol=0, rtol=1e-5), (ent_s - ent_d).abs().max()   # entropy ~10.8
    assert g_s.keys() == g_d.keys() and len(g_s) > 10
    for n in g_s:
        assert torch.allclose(g_s[n], g_d[n], atol=1e-5, rtol=1e-4), (n, (g_s[n] - g_d[n]).abs().max())


def test_plain_model_call_is_ordinary_sdpa(tiny_model_dir):
    """A model switched to segment attention still answers plain calls, padding masks included."""
    from transformers import AutoModelForCausalLM

    tr = Trainer(make_cfg(tiny_model_dir))
    ref = AutoModelForCausalLM.from_pretrained(str(tiny_model_dir), dtype=torch.float32, attn_implementation="sdpa")
    ids = torch.tensor([[5, 6, 7, 8, 9], [0, 0, 11, 12, 13]])
    mask = torch.tensor([[1, 1, 1, 1, 1], [0, 0, 1, 1, 1]])
    with torch.no_grad():
        a = tr.model(input_ids=ids, attention_mask=mask).logits
        b = ref(input_ids=ids, attention_mask=mask).logits
    assert tr.model.config._attn_implementation == "slick_segments"
    assert torch.allclose(a[0], b[0], atol=1e-5) and torch.allclose(a[1, 2:], b[1, 2:], atol=1e-5)


def test_weight_cast_cache_casts_once_per_region():
    w = torch.randn(8, 4)
    with cached_weight_casts():
        a, b = _cast(w, torch.bfloat16), _cast(w, torch.bfloat16)
        with cached_weight_casts():   # nested: the same cache
            c = _cast(w, torch.bfloat16)
        assert a is b is c and a.dtype == torch.bfloat16
    d = _cast(w, torch.bfloat16)
    assert d is not a and torch.equal(d, a)       # outside a region: a fresh cast each time
    assert _cast(w, torch.float32) is w


def test_cast_once_per_step_gives_the_per_micro_batch_gradients_bit_for_bit(tiny_model_dir, monkeypatch):
    """Autocast with one region around the micro-batch loop (weights cast once, the cast reused by every
    micro-batch's forward and backward) gives exactly the gradients of a fresh cast per micro-batch."""
    import contextlib

    from tests.test_train import simple_loss

    samples = make_samples(8, seed=5)
    adv = [torch.randn(len(s.response_ids), generator=torch.Generator().manual_seed(i)) for i, s in enumerate(samples)]

    def grads(cast_once: bool):
        tr = Trainer(make_cfg(tiny_model_dir, dtype="bf16", micro_batch_size=2))
        assert tr.scheme == "autocast"
        if not cast_once:
            monkeypatch.setattr(tr, "_cast_once", contextlib.nullcontext)
        tr.forward_backward(batch_of(samples, adv), simple_loss)
        return {n: p.grad.clone() for n, p in tr.model.named_parameters()}

    a, b = grads(True), grads(False)
    assert a.keys() == b.keys()
    for n in a:
        assert torch.equal(a[n], b[n]), (n, (a[n] - b[n]).abs().max())


def test_a_long_segment_is_attended_alone_over_its_prompt_and_itself():
    """Rows 0-3: a prompt; rows 4-23: a 20-row response that sees it (long at 16 rows); rows 24-27: a short
    sample. The short segments are padded blocks; the long one is attended over rows 0-3 and 4-23, causally."""
    seg = Segments.build([(0, 0, 0, 4), (0, 4, 4, 24), (24, 0, 24, 28)], 28, long_rows=16)
    assert seg.long == ((0, 4, 4, 24),) and seg.q_index.shape == (2, 4) and seg.slots == 8 + 20
    assert seg.out_index[4:24].tolist() == list(range(8, 28))
    assert seg.long_rows(0).tolist() == list(range(24))
    assert seg.cost == 2 * 4 * 4 + 24 * 25 // 2 and seg.worth_it()
    # a long response after a 3-row prompt in the middle of a row: its rows are the prompt's, then its own
    seg = Segments.build([(0, 0, 0, 2), (2, 0, 2, 5), (2, 3, 5, 25)], 25, long_rows=16)
    assert seg.long_rows(0).tolist() == [2, 3, 4] + list(range(5, 25))


@pytest.mark.parametrize("fused", [True, False])
def test_long_segments_equal_the_dense_mask(tiny_model_dir, fused):
    """Long segments, each attended alone by torch's causal kernel, give the dense mask's logprobs and gradients,
    through slick's fused layers (the flash kernel's forward and backward) and through the HF layers (SDPA)."""
    tr = Trainer(make_cfg(tiny_model_dir, disable_fused_layers=not fused))
    assert bool(tr.fused_layers) is fused
    samples = long_prompt_samples()
    mb = pack_shared_prompts(samples, list(range(len(samples))))
    seg = Segments.build(mb.segments.spans, mb.segments.n, long_rows=16)
    assert [s1 - s0 for _, _, s0, s1 in seg.long] == [20, 20, 25]   # the two prompts, the long response (after one)
    lp_b, ent_b, g_b = _run(tr, mb, (seg.mask, seg))
    lp_d, ent_d, g_d = _run(tr, mb, (seg.dense_mask(), None))
    assert torch.allclose(lp_b, lp_d, atol=1e-5, rtol=0), (lp_b - lp_d).abs().max()
    assert torch.allclose(ent_b, ent_d, atol=0, rtol=1e-5)
    assert g_b.keys() == g_d.keys() and len(g_b) > 10
    for n in g_b:
        assert torch.allclose(g_b[n], g_d[n], atol=1e-5, rtol=1e-4), (n, (g_b[n] - g_d[n]).abs().max())


def _run(trainer, mb, attention):
    trainer.model.zero_grad(set_to_none=True)
    lp, ent = trainer._fwd(mb.input_ids, mb.position_ids, attention, mb.gather_index, mb.targets, 1.0, 64, True, True)
    (lp.sum() + 0.1 * ent.sum()).backward()
    return lp.detach(), ent.detach(), {n: p.grad.clone() for n, p in trainer.model.named_parameters()
                                       if p.grad is not None}
