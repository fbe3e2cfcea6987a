"""slick.algo.batch.TrainBatch: one typed batch per rollout step, every column sliced in lockstep, and the loop's
training phase (slick.loop.step.train_on_batch) giving each optimizer step one slice of it."""
import ast
import dataclasses
from pathlib import Path

import pytest
import torch

from slick.algo.batch import TrainBatch
from slick.algo.sessions import SESSION_KEY, spread_session_advantages, split_sessions
from slick.algo.assemble import objective_from_config
from slick.loop.step import train_on_batch
from slick.train.trainer import Trainer
from slick.types import Sample
from tests.test_train import make_cfg, make_samples

ROOT = Path(__file__).resolve().parents[1]


def full_batch(n=4):
    """A batch with every column set, each entry naming its column and sample: (field name, position)."""
    samples = [Sample(index=i, response_ids=[10 + i] * (i + 1), loss_mask=[1] * (i + 1)) for i in range(n)]
    batch = TrainBatch.from_samples(samples, [float(i) for i in range(n)])
    missing = {f.name: [(f.name, i) for i in range(n)] for f in dataclasses.fields(batch)
               if getattr(batch, f.name) is None}
    return batch.with_columns(**missing)


def test_every_field_is_sliced_and_selected():
    """slice/select cut every field (iterated from dataclasses.fields, so a new column cannot be forgotten)."""
    batch = full_batch(4)
    names = [f.name for f in dataclasses.fields(batch)]
    assert all(getattr(batch, n) is not None for n in names)
    assert {"tokens", "loss_mask", "rewards", "advantages", "old_logprobs", "ref_logprobs", "teacher_logprobs",
            "values", "returns", "versions"} <= set(names)
    part = batch.slice(1, 3)
    picked = batch.select([3, 0])
    assert len(batch) == 4 and len(part) == 2 and len(picked) == 2
    for n in names:
        assert getattr(part, n) == getattr(batch, n)[1:3], n
        assert getattr(picked, n) == [getattr(batch, n)[3], getattr(batch, n)[0]], n
    assert part.tokens == [[11, 11], [12, 12, 12]] and picked.rewards == [3.0, 0.0]
    assert [s.index for s in part.samples] == [1, 2]


def test_unset_columns_stay_none_and_lengths_are_checked():
    samples = make_samples(3)
    batch = TrainBatch.from_samples(samples, [1, 0, 1], versions=[5, 5, 6])
    assert batch.rewards == [1.0, 0.0, 1.0] and all(type(r) is float for r in batch.rewards)
    assert batch.tokens == [s.response_ids for s in samples] and batch.loss_mask == [s.loss_mask for s in samples]
    assert batch.response_lengths() == [len(s.response_ids) for s in samples]
    assert batch.slice(0, 2).advantages is None and batch.select([2]).versions == [6]
    with pytest.raises(ValueError, match="column 'advantages' has 2 entries for 3 samples"):
        batch.with_columns(advantages=[torch.zeros(1), torch.zeros(1)])
    with pytest.raises(ValueError, match="column 'rewards' has 2 entries for 3 samples"):
        TrainBatch.from_samples(samples, [1.0, 0.0])
    with pytest.raises(TypeError):
        batch.with_columns(adapter_ids=[0, 0, 0])   # not a field (yet): a typo is not silently kept


class RecordingTrainer(Trainer):
    """The real trainer, keeping what each optimizer step was given."""

    def __init__(self, cfg):
        super().__init__(cfg)
        self.calls = []

    def train_step(self, batch, objective):
        self.calls.append((list(batch.samples), list(batch.advantages), batch.old_logprobs))
        return super().train_step(batch, objective)


def test_each_optimizer_step_gets_one_slice(tiny_model_dir):
    """Two optimizer steps per rollout over 4 samples: each gets 2 consecutive samples with their own advantages
    and old logprobs, the same tensors the returned batch holds."""
    cfg = make_cfg(tiny_model_dir, advantage_estimator="grpo", rollout_batch_size=2, n_samples_per_prompt=2,
                   num_steps_per_rollout=2)
    tr = RecordingTrainer(cfg)
    samples = make_samples(4)
    batch = TrainBatch.from_samples(samples, [1.0, 0.0, 0.0, 1.0], versions=[0, 0, 1, 1])
    metrics, out = train_on_batch(cfg, tr, batch, objective_from_config(cfg), step=0)
    assert tr.version == 2 and metrics["train/skipped_steps"] == 0.0
    assert out.rewards == batch.rewards and out.versions == [0, 0, 1, 1] and out.values is None
    assert len(out.advantages) == 4 and len(out.old_logprobs) == 4 and out.ref_logprobs is None
    assert [len(c[0]) for c in tr.calls] == [2, 2]
    for k, (got_samples, got_adv, got_old) in enumerate(tr.calls):
        assert got_samples == samples[2 * k:2 * k + 2]
        assert all(a is b for a, b in zip(got_adv, out.advantages[2 * k:2 * k + 2]))
        assert all(a is b for a, b in zip(got_old, out.old_logprobs[2 * k:2 * k + 2]))
    a = 0.5 / (0.5 ** 0.5 + 1e-6)   # GRPO: (r - group mean) / (unbiased std + eps), groups [1, 0] and [0, 1]
    assert [float(x[0]) for x in out.advantages] == pytest.approx([a, -a, -a, a])


def test_sessions_are_an_algorithm_concern():
    """The session split and spread live in slick.algo.sessions; rollout code no longer computes advantages."""
    def sample(mask, sid):
        return Sample(response_ids=[5] * len(mask), loss_mask=mask, metadata={SESSION_KEY: {"id": sid, "calls": 1}})

    samples = [sample([1, 0, 1], "a"), sample([1, 1], "a"), sample([0, 1], "b")]
    sessions = split_sessions(samples)
    assert sessions == [[0, 1], [2]]
    assert split_sessions([sample([1], "a"), sample([1], "b")]) is None
    adv = spread_session_advantages(sessions, [torch.tensor([0.0, 2.0]), torch.tensor([-1.5])],
                                    [s.loss_mask for s in samples])
    assert [x.tolist() for x in adv] == [[2.0, 0.0, 2.0], [2.0, 2.0], [0.0, -1.5]]
    agent = ast.parse((ROOT / "slick/rollout/agent.py").read_text())
    names = {n.name for n in ast.walk(agent) if isinstance(n, ast.FunctionDef)}
    imported = {a.name for n in ast.walk(agent) if isinstance(n, ast.ImportFrom) and "loop" in (n.module or "")
                for a in n.names}
    assert not {"split_sessions", "session_advantages"} & names and not imported
