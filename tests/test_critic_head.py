"""The critic as a head: the critic is a Trainer built with the value head and the value loss; it trains through
the Trainer's own train_step (same signature) and its one micro-batch loop, and its value loss is the one the
critic's former loop computed."""
from __future__ import annotations

import ast
import inspect
from pathlib import Path

import torch

from slick.algo.value import value_loss
from slick.cluster.critic_group import RayCriticGroup
from slick.train.critic import Critic, value_objective
from slick.algo.batch import sample_loss_mask as loss_mask
from slick.train.packing import pad_stack
from slick.train.heads import PolicyHead, ValueHead
from slick.train.trainer import Trainer
from slick.types import Sample
from tests.test_critic import make_cfg, make_samples, targets_for
from tests.batches import value_batch

SLICK = Path(__file__).resolve().parent.parent / "slick"


def test_critic_is_the_trainer_with_the_value_head(tiny_model_dir):
    """No subclass: the critic is a Trainer built with the value head (slick.train.heads), the policy the same
    class with the policy head; the Ray critic group takes train_step's parameters (names, order, defaults)."""
    critic, policy = Critic(make_cfg(tiny_model_dir)), Trainer(make_cfg(tiny_model_dir))
    assert type(critic) is Trainer and type(policy) is Trainer
    assert (critic.head.name, policy.head.name) == ("value", "policy")
    assert type(critic.head) is ValueHead and type(policy.head) is PolicyHead
    import slick.train.critic as critic_module
    assert [c for c in vars(critic_module).values() if isinstance(c, type) and issubclass(c, Trainer)] == [Trainer]
    want = [(p.name, p.default) for p in inspect.signature(Trainer.train_step).parameters.values()]
    got = [(p.name, p.default) for p in inspect.signature(RayCriticGroup.train_step).parameters.values()]
    assert got == want


def test_only_the_trainer_iterates_micro_batches():
    """AST over slick/: every `for` over micro-batches (a call to _micro_batches or split_micro_batches) is in
    slick/train/trainer.py, and there are exactly two (compute_logprobs and forward_backward)."""
    names = {"_micro_batches", "split_micro_batches"}
    found = []
    for path in sorted(SLICK.rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            if isinstance(node, ast.For):
                for call in ast.walk(node.iter):
                    if isinstance(call, ast.Call):
                        f = call.func
                        name = f.attr if isinstance(f, ast.Attribute) else getattr(f, "id", None)
                        if name in names:
                            found.append((str(path.relative_to(SLICK)), node.lineno))
    assert [p for p, _ in found] == ["train/trainer.py", "train/trainer.py"], found


def _old_loop_step(c: Trainer, cfg, samples, returns, old_values) -> dict:
    """The critic's former train_step, as it was before the head (its own micro-batch loop), for one process."""
    masks = [loss_mask(s) for s in samples]
    num_samples, num_tokens = len(samples), int(sum(sum(m) for m in masks))
    clip, per_token = float(cfg.value_clip), bool(cfg.calculate_per_token_loss)
    sums: dict = {}
    c.optimizer.zero_grad(set_to_none=True)
    with c._cast_once():
        for idx in c._plan(samples)[0]:
            vals, _ = c._forward(c._fwd, c._pack(samples, idx), False, False)
            T = max(len(samples[i].response_ids) for i in idx)
            values = pad_stack(vals, T, dtype=torch.float32)

            def stack(rows):
                return pad_stack([torch.as_tensor(r, dtype=torch.float32) for r in rows], T, dtype=torch.float32)

            loss, metrics = value_loss(values, stack([old_values[i] for i in idx]), stack([returns[i] for i in idx]),
                                       stack([masks[i] for i in idx]), clip, per_token,
                                       num_samples=num_samples, num_tokens=num_tokens)
            loss.backward()
            for k, v in metrics.items():
                sums[k] = sums.get(k, 0.0) + float(v)
    out = dict(sums)
    out["lr"] = float(c.optimizer.param_groups[0]["lr"])
    out["grad_norm"] = c.optimizer_step()
    return out


def test_value_loss_and_update_equal_the_former_critic_loop(tiny_model_dir):
    """Two identical critics with a random head, a clip that binds, tool tokens, rollout logprobs on the samples
    and 3 micro-batches: the head's train_step and the former loop give bit-equal metrics and weights, and the
    value head reports no rollout-logprob comparison."""
    cfg = make_cfg(tiny_model_dir, value_clip=0.05, micro_batch_size=2)
    a, b = Critic(cfg), Critic(cfg)
    g = torch.Generator().manual_seed(3)
    w, bias = torch.randn(a.model.head.weight.shape, generator=g) * 0.1, torch.randn(1, generator=g) * 0.1
    for c in (a, b):
        with torch.no_grad():
            c.model.head.weight.copy_(w)
            c.model.head.bias.copy_(bias)
    samples = [Sample(index=s.index, prompt_ids=s.prompt_ids, response_ids=s.response_ids, loss_mask=s.loss_mask,
                      rollout_logprobs=[-1.0] * len(s.response_ids)) for s in make_samples(6, tool_tokens=True)]
    returns = targets_for(samples)
    old = a.compute_values(samples)
    assert all(torch.equal(x, y) for x, y in zip(old, b.compute_values(samples)))
    old = [v + 0.1 * targets_for(samples, seed=5)[i] for i, v in enumerate(old)]   # the clip binds somewhere

    new = a.train_step(value_batch(samples, returns, old), value_objective(cfg))
    ref = _old_loop_step(b, cfg, samples, returns, old)
    for key in ("value_loss", "vf_clipfrac", "values_mean", "returns_mean", "lr", "grad_norm"):
        assert new[key] == ref[key], (key, new[key], ref[key])
    assert 0.0 < new["vf_clipfrac"] < 1.0 and new["value_loss"] > 0.0
    assert "train_rollout_logprob_abs_diff" not in new and new["skipped_steps"] == 0.0
    assert a.version == b.version == 1
    for (n, p), q in zip(a.model.named_parameters(), b.model.parameters()):
        assert torch.equal(p, q), n
