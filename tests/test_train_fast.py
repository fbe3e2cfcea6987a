"""The fused chunked lm-head + logprob + entropy node equals the plain path (logits -> log_softmax).

Tolerances (relative to the largest entry of the reference tensor, or absolute when that is below 1):
fp32: 1e-5 on logprobs, entropy and gradients (the fused backward is closed-form, the reference is autograd
through log_softmax; only summation order differs). bf16 matmuls (autocast or bf16 weights): both paths
round the same bf16 logits, so logprobs and entropy still agree to 1e-5; gradients to 2**-7 (d loss / d logits
is rounded to bf16 before the matmuls in both; the accumulation order differs, so entries differ by up to
one bf16 ulp of the largest entry, 2**-7).
"""
import pytest
import torch
import torch.nn.functional as F

from slick.train.logprobs import FusedLogprobEntropy, chunked_logprobs, logprobs_from_logits
from slick.train.trainer import Trainer
from tests.test_train import make_cfg
from tests.test_train_shared_prompts import grouped_samples
from tests.batches import batch_of

V, H, N = 300, 24, 37


def _inputs(seed=0, bias=False, dtype=torch.float32, n=N):
    g = torch.Generator().manual_seed(seed)
    head = torch.nn.Linear(H, V, bias=bias)
    with torch.no_grad():
        head.weight.copy_(torch.randn(V, H, generator=g) * 0.5)
        if bias:
            head.bias.copy_(torch.randn(V, generator=g))
    head = head.to(dtype)
    h = (torch.randn(n, H, generator=g) * 1.5).to(dtype).requires_grad_(True)
    tgt = torch.randint(0, V, (n,), generator=g)
    w_lp = torch.randn(n, generator=g)
    w_lp[::4] = 0.0                    # a loss mask with zeros
    w_ent = torch.randn(n, generator=g)
    w_ent[1::3] = 0.0
    return head, h, tgt, w_lp, w_ent


def _run(fused, head, h, tgt, w_lp, w_ent, temperature, entropy_grad, chunk, softcap, autocast):
    head.zero_grad(set_to_none=True)
    h.grad = None
    ctx = torch.autocast("cpu", dtype=torch.bfloat16) if autocast else torch.autocast("cpu", enabled=False)
    with ctx:
        if fused:
            lp, ent = chunked_logprobs(h, head, tgt, temperature, chunk, True, entropy_grad, softcap)
        else:
            lp, ent = logprobs_from_logits(head(h), tgt, temperature, True, entropy_grad, softcap)
    loss = (w_lp * lp).sum() + (w_ent * ent).sum()
    loss.backward()
    grads = [h.grad.float(), head.weight.grad.float()] + ([head.bias.grad.float()] if head.bias is not None else [])
    return lp.detach(), ent.detach(), float(loss.detach()), grads


@pytest.mark.parametrize("temperature", [1.0, 0.7])
@pytest.mark.parametrize("entropy_grad", [True, False])
@pytest.mark.parametrize("chunk,softcap,bias", [(5, None, False), (1000, None, True), (8, 3.0, True)])
def test_fused_equals_reference_fp32(temperature, entropy_grad, chunk, softcap, bias):
    head, h, tgt, w_lp, w_ent = _inputs(bias=bias)
    ref = _run(False, head, h, tgt, w_lp, w_ent, temperature, entropy_grad, chunk, softcap, False)
    got = _run(True, head, h, tgt, w_lp, w_ent, temperature, entropy_grad, chunk, softcap, False)
    assert got[0].dtype == torch.float32 and got[1].dtype == torch.float32
    for a, b in zip(got[:2], ref[:2]):
        assert (a - b).abs().max() <= 1e-5 * max(1.0, b.abs().max()), ((a - b).abs().max(), b.abs().max())
    assert got[2] == pytest.approx(ref[2], abs=1e-4)
    for a, b in zip(got[3], ref[3]):
        assert (a - b).abs().max() <= 1e-5 * b.abs().max(), ((a - b).abs().max(), b.abs().max())
    if not entropy_grad:   # entropy is a constant: its weights must not change any gradient
        again = _run(True, head, h, tgt, w_lp, w_ent * 0, temperature, entropy_grad, chunk, softcap, False)
        for a, b in zip(got[3], again[3]):
            assert torch.equal(a, b)


@pytest.mark.parametrize("chunk", [100, 1024, 3000])
def test_weight_gradient_over_groups_of_chunks_equals_reference(chunk):
    """Backward adds the lm head's weight gradient once per group of chunks (WGRAD_ROWS positions, whole chunks):
    2,500 positions in chunks of 100 make groups of 1,100, 1,100 and 300; of 1,024 one chunk per group; of 3,000 a
    single chunk."""
    from slick.train.logprobs import WGRAD_ROWS

    assert WGRAD_ROWS < 2500 // 2
    head, h, tgt, w_lp, w_ent = _inputs(seed=2, bias=True, n=2500)
    ref = _run(False, head, h, tgt, w_lp, w_ent, 0.8, True, chunk, None, False)
    got = _run(True, head, h, tgt, w_lp, w_ent, 0.8, True, chunk, None, False)
    for a, b in zip(got[3], ref[3]):
        assert (a - b).abs().max() <= 1e-5 * b.abs().max(), ((a - b).abs().max(), b.abs().max())


@pytest.mark.parametrize("scheme", ["autocast", "bf16"])
@pytest.mark.parametrize("temperature", [1.0, 0.6])
def test_fused_equals_reference_bf16(scheme, temperature):
    dtype = torch.bfloat16 if scheme == "bf16" else torch.float32
    head, h, tgt, w_lp, w_ent = _inputs(seed=1, dtype=dtype)
    ref = _run(False, head, h, tgt, w_lp, w_ent, temperature, True, 7, None, scheme == "autocast")
    got = _run(True, head, h, tgt, w_lp, w_ent, temperature, True, 7, None, scheme == "autocast")
    for a, b in zip(got[:2], ref[:2]):
        assert (a - b).abs().max() <= 1e-5 * max(1.0, b.abs().max()), ((a - b).abs().max(), b.abs().max())
    for a, b in zip(got[3], ref[3]):
        scale = b.abs().max()
        assert (a - b).abs().max() <= 2 ** -7 * scale, ((a - b).abs().max(), scale)   # one bf16 ulp
    assert got[3][0].dtype == torch.float32


def test_no_grad_and_without_entropy():
    head, h, tgt, *_ = _inputs()
    with torch.no_grad():
        lp, ent = chunked_logprobs(h, head, tgt, 0.9, 6, with_entropy=False)
        ref, _ = logprobs_from_logits(head(h), tgt, 0.9)
    assert ent is None and not lp.requires_grad
    assert torch.allclose(lp, ref, atol=1e-5, rtol=0)
    lp, ent = chunked_logprobs(h, head, tgt, 0.9, 6, with_entropy=False)
    lp.sum().backward()
    assert h.grad is not None and head.weight.grad is not None


def test_fused_saves_no_vocab_sized_tensor():
    """The forward keeps O(n) numbers per row for backward: nothing of the [n, V] logits."""
    head, h, tgt, *_ = _inputs()
    saved = []

    def pack(t):
        saved.append(t.numel())
        return t

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        lp, ent = FusedLogprobEntropy.apply(h, head.weight, None, tgt, 1.0, 8, True, True, None)
    assert saved and max(saved) == V * H          # the weight itself (a parameter, not a copy)
    assert sum(saved) == V * H + N * H + 3 * N    # weight, hidden, targets, log-sum-exp, E[z]
    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        saved.clear()
        logprobs_from_logits(F.linear(h, head.weight), tgt)
    assert max(saved) >= N * V                    # the reference keeps the logits


def _loss_fn(x):  # x: slick.algo.LossInputs
    loss = -((x.advantages * x.logprobs + 0.05 * x.entropy) * x.mask).sum() / x.num_samples
    return loss, {}


@pytest.mark.parametrize("dtype", ["fp32", "bf16"])
def test_trainer_step_equals_plain_logits(tiny_model_dir, dtype):
    """A trainer step (shared-prompt packing, mask zeros, T=0.7, entropy bonus) equals per-sample full-logits
    forwards with log_softmax, in logprobs and in every parameter gradient."""
    tr = Trainer(make_cfg(tiny_model_dir, dtype=dtype, micro_batch_size=6, rollout_temperature=0.7,
                          entropy_coef=0.05, logprob_chunk_size=4))
    samples = grouped_samples(groups=2, n=3)
    for s in samples[::2]:
        s.loss_mask[0] = 0
    adv = [torch.full((len(s.response_ids),), float(i % 3) - 1.0) for i, s in enumerate(samples)]
    assert tr._pack(samples, list(range(6))).attention_mask is not None   # shared-prompt layout
    tr.forward_backward(batch_of(samples, adv), _loss_fn)
    got = {n: p.grad.float().clone() for n, p in tr.model.named_parameters()}
    tr.model.zero_grad(set_to_none=True)
    total = 0.0
    ctx = torch.autocast("cpu", dtype=torch.bfloat16) if dtype == "bf16" else torch.autocast("cpu", enabled=False)
    for s, a in zip(samples, adv):
        ids = torch.tensor([s.prompt_ids + s.response_ids[:-1]])
        with ctx:
            logits = tr.model(input_ids=ids).logits[0, len(s.prompt_ids) - 1:]
        lp, ent = logprobs_from_logits(logits, torch.tensor(s.response_ids), 0.7)
        m = torch.tensor(s.loss_mask, dtype=torch.float32)
        loss = -((a * lp + 0.05 * ent) * m).sum() / len(samples)
        loss.backward()
        total += float(loss)
    for n, p in tr.model.named_parameters():
        ref = p.grad.float()
        tol = 1e-5 + 1e-4 * ref.abs().max() if dtype == "fp32" else 2e-2 * ref.abs().max()
        assert (got[n] - ref).abs().max() <= tol, (n, (got[n] - ref).abs().max(), ref.abs().max())
