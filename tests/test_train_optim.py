"""slick.train.optim: AdamW with bf16 moments (stochastic rounding) against torch's fused AdamW."""
import math

import pytest
import torch

from slick.train import optim as O
from slick.ckpt.checkpoint import load_checkpoint, save_checkpoint
from slick.train.optim import LowPrecisionAdamW, stochastic_round_bf16
from slick.train.trainer import Trainer
from tests.test_train import make_cfg, make_samples, simple_loss
from tests.batches import batch_of


def _params(seed=0):
    g = torch.Generator().manual_seed(seed)
    # one tensor over two kernel slices (1M elements each) and a ragged last slice
    shapes = [(3,), (17, 5), ((1 << 20) + 12345,)]
    ps = [torch.randn(s, generator=g).requires_grad_(True) for s in shapes]
    grads = [[torch.randn(s, generator=g) * 1e-2 for s in shapes] for _ in range(3)]
    return ps, grads


def _run(opt, ps, grads):
    for gs in grads:
        for p, gr in zip(ps, gs):
            p.grad = gr.clone()
        opt.step()


def test_fp32_moments_equal_torch_fused_adamw_bitwise():
    kw = dict(lr=1e-2, betas=(0.9, 0.99), weight_decay=0.1)
    a, grads = _params()
    b = [p.detach().clone().requires_grad_(True) for p in a]
    _run(torch.optim.AdamW(a, fused=True, **kw), a, grads)
    ours = LowPrecisionAdamW(b, exp_avg_dtype=torch.float32, exp_avg_sq_dtype=torch.float32, **kw)
    _run(ours, b, grads)
    for pa, pb in zip(a, b):
        assert torch.equal(pa, pb)
    st = ours.state[b[2]]
    assert float(st["step"]) == 3.0 and st["exp_avg"].dtype == torch.float32


def test_stochastic_rounding_is_unbiased():
    n = 1_000_000
    g = torch.Generator().manual_seed(3)
    x = torch.full((n,), 1.0 + 2.0 ** -10)          # 1/8 of the way from 1 to the next bf16 value 1 + 2^-7
    dither = torch.randint(0, 65536, (n,), dtype=torch.int32, generator=g)
    y = stochastic_round_bf16(x, dither)
    assert torch.equal(y, y.to(torch.bfloat16).float())       # bf16-representable: the later cast is exact
    up = (y == 1.0 + 2.0 ** -7).float().mean().item()
    assert set(y.unique().tolist()) == {1.0, 1.0 + 2.0 ** -7}
    # Bernoulli(1/8) over 1M draws: std 3.3e-4; 6 std bound
    assert abs(up - 0.125) < 6 * math.sqrt(0.125 * 0.875 / n)
    # negative values mirror (rounding away from zero with the same probability)
    yn = stochastic_round_bf16(-x, dither)
    assert torch.equal(yn, -y)
    # values already representable never move, whatever the dither
    exact = torch.tensor([0.0, 1.0, -2.5, 3.0e-20, 65280.0]).to(torch.bfloat16).float()
    assert torch.equal(stochastic_round_bf16(exact, torch.full((5,), 65535, dtype=torch.int32)), exact)


def test_bf16_second_moment_follows_fp32_where_nearest_rounding_stalls():
    """exp_avg_sq moves 0.1% a step, under half a bf16 ulp: round-to-nearest stalls, stochastic rounding does not."""
    n, steps, beta2 = 4096, 3000, 0.999
    p = torch.zeros(n, requires_grad=True)
    opt = LowPrecisionAdamW([p], lr=0.0, betas=(0.9, beta2), seed=5)
    p.grad = torch.full((n,), 0.5)
    v_nearest = torch.zeros(n, dtype=torch.bfloat16)
    for _ in range(steps):
        opt.step()
        v_nearest = (v_nearest.float() * beta2 + (1 - beta2) * 0.25).to(torch.bfloat16)
    exact = 0.25 * (1 - beta2 ** steps)
    v = opt.state[p]["exp_avg_sq"]
    assert v.dtype == torch.bfloat16 and opt.state[p]["exp_avg"].dtype == torch.bfloat16
    assert abs(v.float().mean().item() / exact - 1) < 0.01            # stochastic: within 1% on average
    assert abs(v_nearest.float().mean().item() / exact - 1) > 0.2     # nearest: stuck far below
    assert torch.allclose(opt.state[p]["exp_avg"].float(), torch.full((n,), 0.5), rtol=0.01)


def test_trainer_with_bf16_moments_steps_like_fp32_and_resumes_exactly(tiny_model_dir, tmp_path):
    samples = make_samples(6)
    adv = [torch.ones(len(s.response_ids)) for s in samples]
    kw = dict(lr=1e-3, clip_grad=1.0)
    ref = Trainer(make_cfg(tiny_model_dir, **kw))
    low = Trainer(make_cfg(tiny_model_dir, exp_avg_dtype="bf16", exp_avg_sq_dtype="bf16", **kw))
    assert isinstance(ref.optimizer, torch.optim.AdamW) and isinstance(low.optimizer, LowPrecisionAdamW)
    w0 = [w.clone() for _, w in ref.named_weights()]
    for _ in range(4):
        ref.train_step(batch_of(samples, adv), simple_loss)
        low.train_step(batch_of(samples, adv), simple_loss)
    # 4 steps of lr 1e-3: the bf16 moments move the total update by 0.09% of its size here; bound 0.5%
    d_ref = torch.cat([(w - w_0).flatten() for (_, w), w_0 in zip(ref.named_weights(), w0)])
    d_low = torch.cat([(w - w_0).flatten() for (_, w), w_0 in zip(low.named_weights(), w0)])
    assert ((d_low - d_ref).norm() / d_ref.norm()).item() < 0.005
    assert all(st["exp_avg_sq"].dtype == torch.bfloat16 for st in low.optimizer.state.values())

    save_checkpoint(tmp_path / "ck", 4, low, {})
    low.train_step(batch_of(samples, adv), simple_loss)
    back = Trainer(make_cfg(tiny_model_dir, exp_avg_dtype="bf16", exp_avg_sq_dtype="bf16", **kw))
    assert load_checkpoint(tmp_path / "ck", back)[0] == 4
    assert all(st["exp_avg"].dtype == torch.bfloat16 for st in back.optimizer.state.values())
    back.train_step(batch_of(samples, adv), simple_loss)      # same dither from (seed, step): the same weights
    for (n, a), (_, b) in zip(low.named_weights(), back.named_weights()):
        assert torch.equal(a, b), n


def test_fp32_checkpoint_loads_into_bf16_moments(tiny_model_dir, tmp_path):
    samples = make_samples(4)
    adv = [torch.ones(len(s.response_ids)) for s in samples]
    a = Trainer(make_cfg(tiny_model_dir))
    a.train_step(batch_of(samples, adv), simple_loss)
    save_checkpoint(tmp_path / "ck", 1, a, {})
    b = Trainer(make_cfg(tiny_model_dir, exp_avg_sq_dtype="bf16"))
    load_checkpoint(tmp_path / "ck", b)
    for p, st in b.optimizer.state.items():
        assert st["exp_avg"].dtype == torch.float32 and st["exp_avg_sq"].dtype == torch.bfloat16
    sa = a.optimizer.state_dict()["state"]
    sb = b.optimizer.state_dict()["state"]
    assert all(torch.equal(sa[k]["exp_avg_sq"].to(torch.bfloat16), sb[k]["exp_avg_sq"]) for k in sa)


def test_moment_dtype_flags_are_checked():
    from slick.configure import parse_config
    from slick.config.config import ConfigError
    cfg = parse_config(["--hf-checkpoint", "x", "--exp-avg-dtype", "bf16"], validate=False)
    assert (cfg.exp_avg_dtype, cfg.exp_avg_sq_dtype) == ("bf16", None)    # unset: the plan resolves it
    with pytest.raises((ConfigError, SystemExit)):
        parse_config(["--hf-checkpoint", "x", "--exp-avg-sq-dtype", "fp16"], validate=False)
    assert O.DTYPES["bf16"] is torch.bfloat16


def test_a_non_contiguous_gradient_is_refused_not_updated_in_a_copy():
    p = torch.zeros(4, 3, requires_grad=True)
    opt = LowPrecisionAdamW([p], lr=1e-2)
    p.grad = torch.ones(3, 4).t()                 # a transposed view: not contiguous
    with pytest.raises(ValueError, match=r"shape \(4, 3\) or its gradient is not contiguous"):
        opt.step()


@pytest.mark.parametrize("moments", ["fp32", "bf16"])
def test_weight_decay_reaches_matrices_only(moments):
    # Megatron's rule (slime's trainer) and Hugging Face's Trainer's: biases and norm weights do not decay.
    # Zero gradients leave Adam's step at 0, so a step is the decay alone: lr x wd = 0.5 halves each matrix.
    from slick.config.groups import TrainConfig

    g = torch.Generator().manual_seed(0)
    w, bias, norm = torch.randn(4, 3, generator=g), torch.randn(4, generator=g), torch.randn(3, generator=g)
    ps = [t.clone().requires_grad_(True) for t in (w, bias, norm)]
    cfg = TrainConfig(adam_beta1=0.9, adam_beta2=0.999, weight_decay=0.5, exp_avg_dtype=moments,
                      exp_avg_sq_dtype=moments, seed=0)
    opt = O.make_adamw(ps, cfg, lr=1.0)
    assert [(len(gr["params"]), gr["weight_decay"]) for gr in opt.param_groups] == [(1, 0.5), (2, 0.0)]
    for p in ps:
        p.grad = torch.zeros_like(p)
    opt.step()
    assert torch.equal(ps[0].detach(), w * 0.5)
    assert torch.equal(ps[1].detach(), bias) and torch.equal(ps[2].detach(), norm)
    cfg.weight_decay = 0.0     # no decay: one group, the layout checkpoints without decay have
    assert [len(gr["params"]) for gr in O.make_adamw(ps, cfg, lr=1.0).param_groups] == [3]


def test_weight_decay_run_resumes_exactly_and_another_decay_is_refused_by_name(tiny_model_dir, tmp_path):
    samples = make_samples(4)
    adv = [torch.ones(len(s.response_ids)) for s in samples]
    a = Trainer(make_cfg(tiny_model_dir, lr=1e-3, weight_decay=0.1))
    assert [gr["weight_decay"] for gr in a.optimizer.param_groups] == [0.1, 0.0]
    a.train_step(batch_of(samples, adv), simple_loss)
    save_checkpoint(tmp_path / "ck", 1, a, {})
    a.train_step(batch_of(samples, adv), simple_loss)
    b = Trainer(make_cfg(tiny_model_dir, lr=1e-3, weight_decay=0.1))
    assert load_checkpoint(tmp_path / "ck", b)[0] == 1
    b.train_step(batch_of(samples, adv), simple_loss)
    for (n, x), (_, y) in zip(a.named_weights(), b.named_weights()):
        assert torch.equal(x, y), n
    c = Trainer(make_cfg(tiny_model_dir, lr=1e-3))
    with pytest.raises(ValueError, match=r"2 parameter group\(s\), this run's 1: resume with the --weight-decay"):
        load_checkpoint(tmp_path / "ck", c)
