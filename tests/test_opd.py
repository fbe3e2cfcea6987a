"""On-policy distillation: the advantage terms by hand, --opd-kl-coef 0 equals the plain run exactly, a short
pure-distillation run moves the student toward the teacher, and a teacher with another tokenizer is refused."""
import asyncio
import json
import shutil
import sys
import textwrap

import pytest
import torch

from slick.algo.distill import add_opd_terms, opd_metrics, opd_terms
from slick.config import Config, ConfigError
from slick.configure.validate import validate_config
from slick.loop.sync import train
from slick.models.tiny import make_tiny_model

REWARD = textwrap.dedent('''
    def even_tokens(args, sample):
        ids = sample.response_ids
        return sum(1 for t in ids if t % 2 == 0) / max(len(ids), 1)
''')


def test_opd_terms_are_teacher_minus_student_times_coef():
    t = torch.tensor([[-1.0, -2.0, -0.5], [-3.0, -1.0, -9.0]])
    s = torch.tensor([[-1.5, -1.0, -0.5], [-2.0, -4.0, -1.0]])
    m = torch.tensor([[1.0, 1.0, 0.0], [1.0, 1.0, 1.0]])
    assert torch.equal(opd_terms(t, s, m, 0.5), torch.tensor([[0.25, -0.5, 0.0], [-0.5, 1.5, -4.0]]))
    adv = add_opd_terms([torch.tensor([1.0, 1.0, 1.0]), torch.tensor([-1.0, -1.0, -1.0])], list(t), list(s),
                        [[1, 1, 0], [1, 1, 1]], 2.0)
    assert [a.tolist() for a in adv] == [[2.0, -1.0, 1.0], [-3.0, 5.0, -17.0]]
    only = add_opd_terms([torch.ones(3), torch.ones(3)], list(t), list(s), [[1, 1, 0], [1, 1, 1]], 1.0, only=True)
    assert [a.tolist() for a in only] == [[0.5, -1.0, 0.0], [-1.0, 3.0, -8.0]]
    zero = add_opd_terms([torch.tensor([0.3, -0.7, 0.1])], [t[1]], [s[1]], [[1, 1, 1]], 0.0)
    assert torch.equal(zero[0], torch.tensor([0.3, -0.7, 0.1]))   # coef 0: the estimator's, bit for bit
    m = opd_metrics(list(t), list(s), [[1, 1, 0], [1, 1, 1]])
    assert m["opd/teacher_logprob"] == pytest.approx(-16.0 / 5) and m["opd/student_logprob"] == pytest.approx(-9.5 / 5)
    assert m["opd/kl"] == pytest.approx((-9.5 + 16.0) / 5)


@pytest.fixture()
def setup(tmp_path, tiny_model_dir):
    rows = [{"prompt": f"question {i}: say something", "label": str(i)} for i in range(16)]
    (tmp_path / "p.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    (tmp_path / "opd_rm.py").write_text(REWARD)
    sys.path.insert(0, str(tmp_path))
    yield tmp_path
    sys.path.remove(str(tmp_path))


@pytest.fixture(scope="module")
def teacher_dir(tmp_path_factory):
    """Another random model with the student's tokenizer, peakier (a distribution worth moving toward)."""
    return make_tiny_model(tmp_path_factory.mktemp("teacher"), seed=7, initializer_range=0.3)


def _cfg(model, tmp, run, **over):
    values = dict(hf_checkpoint=str(model), prompt_data=str(tmp / "p.jsonl"), rollout_batch_size=4,
                  n_samples_per_prompt=2, rollout_max_response_len=8, custom_rm_path="opd_rm.even_tokens",
                  lr=1e-3, num_rollout=2, dtype="fp32", run_dir=str(tmp / run), no_progress=True, seed=3,
                  rollout_seed=5, micro_batch_size=4, no_rollout_store=True)
    values.update(over)
    return validate_config(Config.from_flat(values))


def _metrics(tmp, run):
    return [json.loads(x) for x in (tmp / run / "metrics.jsonl").read_text().splitlines()]


def test_opd_with_coef_zero_equals_the_plain_run(setup, tiny_model_dir, teacher_dir):
    plain = asyncio.run(train(_cfg(tiny_model_dir, setup, "plain")))
    opd = asyncio.run(train(_cfg(tiny_model_dir, setup, "opd", use_opd=True, opd_teacher_load=str(teacher_dir),
                                 opd_kl_coef=0.0)))
    a, b = dict(plain.train_parts.trainer.named_weights()), dict(opd.train_parts.trainer.named_weights())
    assert all(torch.equal(a[k], b[k]) for k in a)
    m = _metrics(setup, "opd")[-1]
    assert m["opd/kl"] > 0.5 and m["opd/teacher_logprob"] < m["opd/student_logprob"]
    assert [r["train/loss"] for r in _metrics(setup, "plain")] == [r["train/loss"] for r in _metrics(setup, "opd")]


def test_pure_distillation_moves_the_student_toward_the_teacher(tmp_path, tiny_model_dir):
    """A teacher that learned the <answer> format (30 SFT steps) and a student that half learned it (8 steps):
    16 steps of --opd-only (whitened, --normalize-advantages) bring the per-token KL to the teacher on the
    student's own samples down. One step's KL is a mean over about 60 sampled tokens; the bound (the last 3 steps'
    mean below 85% of the first 3's; 70% was measured) is well outside the step-to-step noise at fixed weights
    (about 5%); without the baseline the same run stayed at 3.6 (measured)."""
    from slick.loop.sft import main as sft
    from tests.test_sft_run import _chats

    (tmp_path / "c.jsonl").write_text("".join(json.dumps(r) + "\n" for r in _chats(56, 0)))
    rows = [{"prompt": r["messages"][0]["content"], "label": "x"} for r in _chats(32, 2)]
    (tmp_path / "p.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    (tmp_path / "opd_rm.py").write_text(REWARD)
    for steps, out in ((8, "student"), (30, "teacher")):
        assert sft(["--hf-checkpoint", str(tiny_model_dir), "--prompt-data", str(tmp_path / "c.jsonl"),
                    "--rollout-batch-size", "8", "--num-rollout", str(steps), "--lr", "6e-3", "--dtype", "fp32",
                    "--run-dir", str(tmp_path / f"run-{out}"), "--save-hf", str(tmp_path / out), "--no-progress",
                    "--no-rollout-store"]) == 0
    sys.path.insert(0, str(tmp_path))
    try:
        asyncio.run(train(_cfg(tmp_path / "student", tmp_path, "distill", use_opd=True,
                               opd_teacher_load=str(tmp_path / "teacher"), opd_only=True, opd_type="megatron",
                               lr=3e-3, num_rollout=16, n_samples_per_prompt=1, rollout_batch_size=8,
                               advantage_estimator="reinforce_plus_plus", apply_chat_template=True,
                               normalize_advantages=True)))
    finally:
        sys.path.remove(str(tmp_path))
    kl = [r["opd/kl"] for r in _metrics(tmp_path, "distill")]
    assert len(kl) == 16
    assert sum(kl[-3:]) / 3 < 0.85 * sum(kl[:3]) / 3, kl


def test_a_teacher_with_another_tokenizer_is_refused_naming_both(setup, tiny_model_dir, tmp_path):
    other = tmp_path / "other"
    shutil.copytree(teacher_src := tiny_model_dir, other)
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(other)
    tok.add_tokens(["<slick_extra_token>"])
    tok.save_pretrained(other)
    with pytest.raises(ConfigError, match=rf"student --hf-checkpoint {teacher_src} and teacher --opd-teacher-load "
                                          rf"{other} have different tokenizers"):
        asyncio.run(train(_cfg(tiny_model_dir, setup, "bad", use_opd=True, opd_teacher_load=str(other))))


@pytest.mark.parametrize("over, words", [
    (dict(use_opd=True, opd_type="sglang", opd_teacher_load="T"), "--opd-teacher-load T: not a model directory"),
    (dict(use_opd=True), "--use-opd needs --opd-teacher-load"),
    (dict(opd_only=True), "--opd-only needs --use-opd"),
])
def test_opd_flags_are_refused_by_name(setup, tiny_model_dir, over, words):
    with pytest.raises(ConfigError, match=words):
        _cfg(tiny_model_dir, setup, "r", **over)
