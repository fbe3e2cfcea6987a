"""Trainer: packing equivalence, chunked logprobs, entropy by hand, train steps, gradient accumulation."""
import math
import random

import pytest
import torch

from slick.config import Config
from slick.configure.validate import validate_config
from slick.train.logprobs import chunked_logprobs, logprobs_from_logits
from slick.train.packing import pack, pack_shared_prompts, split_micro_batches
from slick.train.trainer import Trainer
from slick.types import Sample
from tests.batches import batch_of


def make_cfg(model_dir, **kw):
    base = dict(hf_checkpoint=str(model_dir), dtype="fp32", device="cpu", lr=1e-3, micro_batch_size=4,
                clip_grad=0.0, seed=7, rm_type="exact", rollout_temperature=1.0)
    base.update(kw)
    cfg = Config.from_flat(base)
    return validate_config(cfg, check_files=False) or cfg


def make_samples(n=6, seed=0, vocab=1000):
    rng = random.Random(seed)
    out = []
    for i in range(n):
        p = [rng.randrange(3, vocab) for _ in range(rng.randint(2, 7))]
        r = [rng.randrange(3, vocab) for _ in range(rng.randint(1, 6))]
        out.append(Sample(index=i, prompt_ids=p, response_ids=r, loss_mask=[1] * len(r),
                          rollout_logprobs=[-1.0] * len(r)))
    return out


def reference_logprobs(model, s, temperature=1.0):
    """Independent path: full HF forward of one unpadded sequence, log_softmax of all logits."""
    ids = torch.tensor([s.prompt_ids + s.response_ids])
    with torch.no_grad():
        logits = model(input_ids=ids).logits[0].float() / temperature
    lp = torch.log_softmax(logits, -1)
    P = len(s.prompt_ids)
    tgt = torch.tensor(s.response_ids)
    return lp[P - 1:P - 1 + len(tgt)].gather(-1, tgt[:, None]).squeeze(-1)


def simple_loss(x):
    """A loss_fn for the trainer: takes one slick.algo.LossInputs."""
    loss = -(x.advantages * x.logprobs * x.mask).sum() / x.num_samples
    return loss, {"loss": float(loss.detach()), "pg_loss": float(loss.detach()),
                  "entropy_loss": float((x.entropy * x.mask).sum() / x.num_samples)}


@pytest.fixture(scope="module")
def trainer(tiny_model_dir):
    return Trainer(make_cfg(tiny_model_dir, rollout_temperature=0.7))


# ---------------------------------------------------------------- packing
def test_split_micro_batches_by_count_and_tokens():
    s = make_samples(7)
    s[3].response_ids = []  # empty response: left out
    mbs = split_micro_batches(s, 2)
    assert mbs == [[0, 1], [2, 4], [5, 6]]
    lens = [len(x.prompt_ids) + len(x.response_ids) - 1 for x in s]
    assert lens == [9, 5, 6, 5, 8, 6, 5]  # packed tokens per sample (sample 3 has none: it is left out)
    # 9 alone (9 + 5 > 12), 5 + 6 = 11, 8 alone (8 + 6 > 12), 6 + 5 = 11
    assert split_micro_batches(s, 100, max_tokens=12) == [[0], [1, 2], [4], [5, 6]]


def test_token_budget_counts_a_shared_prompt_once():
    """GRPO groups: 3 prompts x 2 samples. A prompt shared in the row counts once, as pack_shared_prompts lays
    it out; the packed rows' real lengths stay within the budget."""
    s = []
    for g, (P, rs) in enumerate([(10, (4, 6)), (8, (5, 5)), (12, (3, 7))]):
        for r in rs:
            s.append(Sample(index=len(s), group_index=g, prompt_ids=[100 + g] * P, response_ids=[7] * r,
                            loss_mask=[1] * r))
    # unshared, every pair exceeds 20 (13 + 15, ...); shared: 13 + 5 = 18, then + 12 (a new prompt) > 20
    assert split_micro_batches(s, 100, max_tokens=20) == [[0], [1], [2], [3], [4], [5]]
    shared = split_micro_batches(s, 100, max_tokens=20, shared_prompts=True)
    assert shared == [[0, 1], [2, 3], [4, 5]]
    assert [pack_shared_prompts(s, mb).num_tokens for mb in shared] == [18, 16, 20]   # the rows, as counted
    assert pack(s, [0, 1]).num_tokens == 28
    assert split_micro_batches(s, 100, max_tokens=40, shared_prompts=True) == [[0, 1, 2, 3], [4, 5]]   # 34, +20


def test_pack_layout():
    a = Sample(prompt_ids=[5, 6, 7], response_ids=[8, 9])
    b = Sample(prompt_ids=[10], response_ids=[11, 12, 13])
    mb = pack([a, b], [0, 1])
    assert mb.input_ids.tolist() == [[5, 6, 7, 8, 10, 11, 12]]
    assert mb.position_ids.tolist() == [[0, 1, 2, 3, 0, 1, 2]]
    assert mb.gather_index.tolist() == [2, 3, 4, 5, 6]
    assert mb.targets.tolist() == [8, 9, 11, 12, 13]
    assert mb.response_lengths == [2, 3]


def test_packed_logprobs_equal_unpacked(trainer):
    samples = make_samples(6)
    packed = trainer.compute_logprobs(samples)           # micro_batch_size 4 -> rows of 4 and 2 samples
    for s, lp in zip(samples, packed):
        ref = reference_logprobs(trainer.model, s, temperature=0.7)
        assert lp.dtype == torch.float32 and lp.shape == ref.shape
        assert torch.allclose(lp, ref, atol=1e-5, rtol=0), (lp - ref).abs().max()


def test_packing_without_position_restart_would_leak(trainer):
    """The block-diagonal mask is what makes packing exact: continuous positions give other numbers."""
    samples = make_samples(3)
    mb = pack(samples, [0, 1, 2])
    n = mb.input_ids.shape[1]
    with torch.no_grad():
        out = trainer.model.base_model(input_ids=mb.input_ids, position_ids=torch.arange(n)[None],
                                       use_cache=False)
        h = out.last_hidden_state[0].index_select(0, mb.gather_index)
        lp, _ = chunked_logprobs(h, trainer.model.get_output_embeddings(), mb.targets, 0.7)
    ref = torch.cat([reference_logprobs(trainer.model, s, 0.7) for s in samples])
    assert (lp - ref).abs().max() > 1e-3


# ---------------------------------------------------------------- logprobs / entropy
def test_entropy_and_logprob_by_hand():
    # p = [1/4, 3/4] from logits [0, ln 3]: H = -(.25 ln .25 + .75 ln .75) = 0.5623351446188083
    # logprob(token 1) = ln .75 = -0.2876820724517809; temperature 2 on [0, 2 ln 3] gives the same z.
    logits = torch.tensor([[0.0, math.log(3.0)], [0.0, 2 * math.log(3.0)], [0.0, 0.0]])
    lp, ent = logprobs_from_logits(logits[:1], torch.tensor([1]))
    assert lp.item() == pytest.approx(-0.2876820724517809, abs=1e-6)
    assert ent.item() == pytest.approx(0.5623351446188083, abs=1e-6)
    lp, ent = logprobs_from_logits(logits[1:], torch.tensor([1, 0]), temperature=2.0)
    assert lp.tolist() == pytest.approx([-0.2876820724517809, -math.log(2)], abs=1e-6)
    assert ent.tolist() == pytest.approx([0.5623351446188083, math.log(2)], abs=1e-6)


def test_chunked_equals_unchunked_with_grads():
    torch.manual_seed(0)
    head = torch.nn.Linear(16, 50, bias=False)
    h = torch.randn(23, 16, requires_grad=True)
    tgt = torch.randint(0, 50, (23,))
    outs = []
    for chunk in (4, 1000):
        head.zero_grad()
        h.grad = None
        lp, ent = chunked_logprobs(h, head, tgt, temperature=0.8, chunk_size=chunk)
        (lp.sum() + 0.3 * ent.sum()).backward()
        outs.append((lp.detach(), ent.detach(), h.grad.clone(), head.weight.grad.clone()))
    for a, b in zip(*outs):
        assert torch.allclose(a, b, atol=1e-6)
    full = torch.log_softmax(head(h).detach() / 0.8, -1).gather(-1, tgt[:, None]).squeeze(-1)
    assert torch.allclose(outs[0][0], full, atol=1e-6)


# ---------------------------------------------------------------- training
def test_train_step_changes_weights_and_loss_decreases(tiny_model_dir):
    tr = Trainer(make_cfg(tiny_model_dir, lr=3e-3))
    samples = make_samples(6)
    adv = [torch.ones(len(s.response_ids)) for s in samples]
    before = {k: v.clone() for k, v in tr.named_weights()}
    losses = []
    for _ in range(4):
        lps = tr.compute_logprobs(samples)  # the weights the step's forward sees
        m = tr.train_step(batch_of(samples, adv), simple_loss)
        losses.append(m["loss"])
    assert tr.version == 4 and m["skipped_steps"] == 0.0 and m["nonfinite_losses"] == 0.0
    assert all(losses[i + 1] < losses[i] for i in range(3)), losses
    after = dict(tr.named_weights())
    assert any(not torch.equal(before[k], after[k]) for k in before)
    assert m["grad_norm"] > 0 and m["lr"] == pytest.approx(3e-3)
    assert m["tokens"] == sum(len(s.prompt_ids) + len(s.response_ids) - 1 for s in samples)
    assert "pg_loss" in m and "fwd_bwd_time" in m
    # rollout logprobs are all -1.0: the metric is the token mean of |logprob + 1| before the last step
    want = float(torch.cat([(lp + 1.0).abs() for lp in lps]).mean())
    assert m["train_rollout_logprob_abs_diff"] == pytest.approx(want, rel=1e-5)


def test_abs_diff_metric_and_loss_mask(tiny_model_dir):
    tr = Trainer(make_cfg(tiny_model_dir, lr=0.0))
    samples = make_samples(5, seed=3)
    lps = tr.compute_logprobs(samples)
    for s, lp in zip(samples, lps):
        s.rollout_logprobs = (lp + 0.25).tolist()
        s.loss_mask = [1] * len(s.response_ids)
        s.loss_mask[0] = 0 if len(s.response_ids) > 1 else 1
    adv = [torch.ones(len(s.response_ids)) for s in samples]
    m = tr.train_step(batch_of(samples, adv), simple_loss)
    assert m["train_rollout_logprob_abs_diff"] == pytest.approx(0.25, abs=1e-5)
    assert m["response_tokens"] == sum(sum(s.loss_mask) for s in samples)


def test_warmup_lr(tiny_model_dir):
    tr = Trainer(make_cfg(tiny_model_dir, lr=1e-3, lr_warmup_steps=4))
    samples = make_samples(2)
    adv = [torch.ones(len(s.response_ids)) for s in samples]
    lrs = [tr.train_step(batch_of(samples, adv), simple_loss)["lr"] for _ in range(5)]
    assert lrs == pytest.approx([2.5e-4, 5e-4, 7.5e-4, 1e-3, 1e-3])


def assert_same_grad(a, b):
    """Equal up to fp32 summation order: within 1e-5 of the tensor's largest entry (measured: up to 3.7e-6 on
    the embedding gradient, whose entries reach 1.2); a wrong normaliser is off by tens of percent."""
    err, scale = float((a - b).abs().max()), float(a.abs().max())
    assert err <= 1e-5 * scale + 1e-9, (err, scale)


def test_gradient_accumulation_matches_one_big_batch(tiny_model_dir):
    samples = make_samples(8, seed=5)
    g = torch.Generator().manual_seed(1)
    adv = [torch.randn(len(s.response_ids), generator=g) for s in samples]

    def token_loss(x):
        loss = -(x.advantages * x.logprobs * x.mask).sum() / x.num_tokens + 0.01 * (x.entropy * x.mask).sum() / x.num_tokens
        return loss, {"pg_loss": float(loss)}

    grads, metrics = [], []
    for mbs, mtok in ((8, None), (3, None), (100, 25)):
        tr = Trainer(make_cfg(tiny_model_dir, micro_batch_size=mbs, max_tokens_per_micro_batch=mtok,
                              entropy_coef=0.01))
        for loss_fn in (simple_loss, token_loss):
            m = tr.forward_backward(batch_of(samples, adv), loss_fn)
            grads.append([p.grad.clone() for p in tr.master])
            metrics.append(m)
    big_s, big_t = grads[0], grads[1]
    for k in (2, 4):
        for a, b in zip(big_s, grads[k]):
            assert_same_grad(a, b)
        for a, b in zip(big_t, grads[k + 1]):
            assert_same_grad(a, b)
        assert metrics[k]["loss"] == pytest.approx(metrics[0]["loss"], rel=1e-5)
        # metrics reduced with the global normalisers are summed over micro-batches
        assert metrics[k + 1]["pg_loss"] == pytest.approx(metrics[1]["pg_loss"], rel=1e-5)
        assert metrics[k + 1]["loss"] == pytest.approx(metrics[1]["loss"], rel=1e-5)
    assert any(g.abs().sum() > 0 for g in big_s)


def test_ref_model_only_when_kl_needs_it(tiny_model_dir):
    tr = Trainer(make_cfg(tiny_model_dir))
    assert not tr.has_ref and tr.ref_model is None
    with pytest.raises(ValueError, match="no reference model"):
        tr.compute_logprobs(make_samples(1), which="ref")
    tr = Trainer(make_cfg(tiny_model_dir, use_kl_loss=True, kl_loss_coef=0.1, lr=1e-2))
    assert tr.has_ref
    samples = make_samples(3)
    ref0 = tr.compute_logprobs(samples, which="ref")
    act0 = tr.compute_logprobs(samples)
    for a, b in zip(ref0, act0):
        assert torch.allclose(a, b, atol=1e-6)
    adv = [torch.ones(len(s.response_ids)) for s in samples]
    tr.train_step(batch_of(samples, adv, ref_logprobs=ref0), simple_loss)
    ref1 = tr.compute_logprobs(samples, which="ref")
    act1 = tr.compute_logprobs(samples)
    assert all(torch.equal(a, b) for a, b in zip(ref0, ref1))      # frozen
    assert any(not torch.allclose(a, b) for a, b in zip(act0, act1))  # actor moved


@pytest.mark.parametrize("scheme", ["bf16", "autocast"])
def test_bf16_schemes_train(tiny_model_dir, scheme):
    tr = Trainer(make_cfg(tiny_model_dir, dtype="bf16", lr=1e-2), precision=scheme)
    assert tr.scheme == scheme
    assert all(p.dtype == torch.float32 for p in tr.master)
    samples = make_samples(4)
    adv = [torch.ones(len(s.response_ids)) for s in samples]
    l0 = tr.train_step(batch_of(samples, adv), simple_loss)["loss"]
    for _ in range(2):
        l1 = tr.train_step(batch_of(samples, adv), simple_loss)["loss"]
    assert l1 < l0
    lps = tr.compute_logprobs(samples)
    w = dict(tr.named_weights())
    assert w["model.embed_tokens.weight"].dtype == (torch.bfloat16 if scheme == "bf16" else torch.float32)
    assert all(torch.isfinite(lp).all() for lp in lps)


def test_gradient_checkpointing_same_grads(tiny_model_dir):
    samples = make_samples(4)
    adv = [torch.ones(len(s.response_ids)) for s in samples]
    grads = []
    for gc in (False, True):
        tr = Trainer(make_cfg(tiny_model_dir, gradient_checkpointing=gc))
        assert tr.model.is_gradient_checkpointing == gc
        tr.forward_backward(batch_of(samples, adv), simple_loss)
        grads.append([p.grad.clone() for p in tr.master])
    for a, b in zip(*grads):
        assert torch.allclose(a, b, atol=1e-6)


def test_bad_inputs_have_clear_errors(tiny_model_dir, trainer):
    s = make_samples(2)
    s[1].loss_mask = [1]
    s[1].response_ids = [5, 6]
    with pytest.raises(ValueError, match="loss_mask has 1 entries"):
        trainer.forward_backward(batch_of(s, [torch.ones(len(x.response_ids)) for x in s]), simple_loss)
    with pytest.raises(ValueError, match="column 'advantages' has 0 entries for 2 samples"):
        trainer.forward_backward(batch_of(make_samples(2), []), simple_loss)
    with pytest.raises(ValueError, match="the policy head trains on the batch's advantages; advantages not computed"):
        trainer.forward_backward(batch_of(make_samples(2)), simple_loss)
    with pytest.raises(FileNotFoundError, match="hf-checkpoint"):
        Trainer(make_cfg(tiny_model_dir / "nope"))
