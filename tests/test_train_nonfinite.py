"""A non-finite loss or gradient norm never reaches an optimizer step; a rollout step whose every optimizer step
is non-finite stops training with NonFiniteTrainingError (real tiny model, real Trainer)."""
import math

import pytest
import torch

from slick.algo import AlgoParams
from slick.algo.objective import compute_policy_objective
from slick.loop.step import NonFiniteTrainingError, train_on_samples
from slick.train.trainer import Trainer
from tests.test_train import make_cfg, make_samples, simple_loss
from tests.batches import batch_of


def _weights(tr):
    return {n: w.clone() for n, w in tr.named_weights()}


def _same(a, b):
    return all(torch.equal(a[n], b[n]) for n in a)


def _adv(samples):
    return [torch.ones(len(s.response_ids)) for s in samples]


def test_nan_advantage_skips_the_step_and_leaves_nothing_behind(tiny_model_dir, caplog):
    samples = make_samples(6)
    bad = _adv(samples)
    bad[5][0] = float("nan")  # sample 5 is in the second micro-batch (micro_batch_size 4)
    tr = Trainer(make_cfg(tiny_model_dir, lr=1e-2, lr_warmup_steps=2))
    before = _weights(tr)
    with caplog.at_level("WARNING", logger="slick.train.trainer"):
        m = tr.train_step(batch_of(samples, bad), simple_loss)
    assert m["skipped_steps"] == 1.0 and m["nonfinite_losses"] == 1.0
    assert math.isnan(m["grad_norm"]) and math.isnan(m["loss"])
    assert _same(before, _weights(tr))
    assert (tr.version, tr.skipped_steps) == (0, 1)
    assert tr.optimizer.state_dict()["state"] == {} and tr.scheduler.last_epoch == 0  # no AdamW, no lr step
    assert all(p.grad is None for p in tr.master)
    assert "optimizer step skipped at weights version 0: non-finite loss in 1 micro-batch(es)" in caplog.text

    # the skipped step left no trace: the next finite step equals a fresh trainer's first step
    m = tr.train_step(batch_of(samples, _adv(samples)), simple_loss)
    fresh = Trainer(make_cfg(tiny_model_dir, lr=1e-2, lr_warmup_steps=2))
    m_fresh = fresh.train_step(batch_of(samples, _adv(samples)), simple_loss)
    assert m["skipped_steps"] == 0.0 and m["nonfinite_losses"] == 0.0 and tr.version == 1
    assert m["grad_norm"] == m_fresh["grad_norm"] and m["lr"] == m_fresh["lr"] == pytest.approx(5e-3)
    assert _same(_weights(fresh), _weights(tr))


def test_nan_gradient_with_finite_loss_skips_the_step(tiny_model_dir):
    """sqrt at 0: the loss is 0.0, its gradient is inf * 0 = NaN in every parameter the logprobs reach."""
    def nan_grad_loss(x):
        loss = torch.sqrt((x.logprobs * 0.0).sum())
        return loss, {"pg_loss": float(loss.detach())}

    for clip in (0.0, 1.0):
        tr = Trainer(make_cfg(tiny_model_dir, lr=1e-2, clip_grad=clip))
        before = _weights(tr)
        m = tr.train_step(batch_of(make_samples(4), _adv(make_samples(4))), nan_grad_loss)
        assert m["loss"] == 0.0 and m["nonfinite_losses"] == 0.0
        assert m["skipped_steps"] == 1.0 and math.isnan(m["grad_norm"])
        assert _same(before, _weights(tr)) and tr.version == 0


def _loop_cfg(model_dir, **kw):
    # 2 prompts x 4 samples, 2 optimizer steps of 4 samples (one group each) per rollout step
    return make_cfg(model_dir, lr=1e-2, rollout_batch_size=2, n_samples_per_prompt=4, num_steps_per_rollout=2,
                    **kw)


def test_one_nonfinite_optimizer_step_of_two_is_skipped_and_counted(tiny_model_dir, caplog):
    cfg = _loop_cfg(tiny_model_dir)
    assert cfg.global_batch_size == 4
    tr = Trainer(cfg)
    loss_fn = lambda *a, **k: compute_policy_objective(AlgoParams.from_config(cfg), *a, **k)  # noqa: E731
    rewards = [1.0, 0.0, 1.0, 0.0, 1.0, float("nan"), 0.0, 0.0]  # group 2 (second optimizer step) is NaN
    with caplog.at_level("WARNING", logger="slick.loop.step"):
        metrics, tensors = train_on_samples(cfg, tr, make_samples(8), rewards, loss_fn, step=4)
    assert tr.version == 1 and tr.skipped_steps == 1
    assert metrics["train/skipped_steps"] == 1.0 and metrics["train/nonfinite_losses"] == 1.0
    assert math.isfinite(metrics["train/loss"]) and math.isfinite(metrics["train/grad_norm"])
    assert all(torch.isfinite(w).all() for _, w in tr.named_weights())
    assert all(torch.isnan(a).all() for a in tensors["advantages"][4:])
    assert "step 4: 1 of 2 optimizer step(s) skipped" in caplog.text


def test_whole_step_nonfinite_raises_naming_the_step(tiny_model_dir):
    cfg = _loop_cfg(tiny_model_dir)
    tr = Trainer(cfg)
    before = _weights(tr)
    loss_fn = lambda *a, **k: compute_policy_objective(AlgoParams.from_config(cfg), *a, **k)  # noqa: E731
    rewards = [1.0, 0.0, float("inf"), 0.0, float("nan"), 0.0, 1.0, 0.0]
    with pytest.raises(NonFiniteTrainingError, match=r"step 7: training is non-finite: all 2 optimizer step\(s\) "
                                                     r"skipped \(non-finite loss in 2 micro-batch\(es\)") as e:
        train_on_samples(cfg, tr, make_samples(8), rewards, loss_fn, step=7)
    assert len(e.value.tensors["advantages"]) == 8
    assert _same(before, _weights(tr)) and (tr.version, tr.skipped_steps) == (0, 2)
