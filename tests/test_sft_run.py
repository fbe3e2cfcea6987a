"""A short `slick sft` run on a tiny random model: held-out loss falls, the greedy output takes the taught format,
and the run starts no engine."""
import json
import random

import pytest
import torch
from transformers import AutoModelForCausalLM, AutoTokenizer

from slick.loop.sft import main


def _chats(n, seed):
    rng = random.Random(seed)
    rows = []
    for _ in range(n):
        a, b = rng.randint(0, 9), rng.randint(0, 9)
        rows.append({"messages": [{"role": "user", "content": f"{a}+{b}"},
                                  {"role": "assistant", "content": f"<answer>{a + b}</answer>"}]})
    return rows


def _greedy(model_dir, prompts):
    tok = AutoTokenizer.from_pretrained(model_dir)
    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32)
    out = []
    for p in prompts:
        ids = tok.apply_chat_template([{"role": "user", "content": p}], add_generation_prompt=True,
                                      return_tensors="pt", return_dict=True)["input_ids"]
        gen = model.generate(ids, max_new_tokens=6, do_sample=False, attention_mask=torch.ones_like(ids))
        out.append(tok.decode(gen[0, ids.shape[1]:], skip_special_tokens=True))
    return out


def test_sft_teaches_the_answer_format(tiny_model_dir, tmp_path, monkeypatch):
    train, test = tmp_path / "train.jsonl", tmp_path / "test.jsonl"
    train.write_text("".join(json.dumps(r) + "\n" for r in _chats(56, 0)))
    test.write_text("".join(json.dumps(r) + "\n" for r in _chats(8, 1)))
    monkeypatch.setattr("slick.loop.build.make_engines", lambda *a, **k: pytest.fail("SFT started an engine"))
    rc = main(["--hf-checkpoint", str(tiny_model_dir), "--prompt-data", str(train), "--rollout-batch-size", "8",
               "--num-rollout", "30", "--lr", "6e-3", "--lr-decay-style", "cosine", "--lr-decay-iters", "30",
               "--min-lr", "6e-4", "--eval-prompt-data", "test", str(test), "--eval-interval", "10",
               "--dtype", "fp32", "--run-dir", str(tmp_path / "run"), "--save-hf", str(tmp_path / "hf"),
               "--no-progress", "--no-rollout-store"])
    assert rc == 0
    rows = [json.loads(x) for x in (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()]
    evals = [r["eval/test/loss"] for r in rows if "eval/test/loss" in r]
    assert len(evals) == 4   # before training and after steps 10, 20, 30
    # the random model's loss is about ln(49152) = 10.8; 30 steps bring the held-out loss below a third of it
    assert evals[0] > 10.0 and evals[-1] < evals[0] / 3
    assert rows[-1]["eval/test/token_acc"] > 0.5 > rows[0]["eval/test/token_acc"]
    assert rows[-1]["train/lr"] == pytest.approx(6e-4, rel=0.05)   # the cosine schedule reached --min-lr
    prompts = ["3+4", "9+1", "0+0", "5+5"]
    assert not any(o.startswith("<answer>") for o in _greedy(tiny_model_dir, prompts))
    assert all(o.startswith("<answer>") for o in _greedy(tmp_path / "hf", prompts))


def test_sft_progress_shows_trained_tokens_per_second(tiny_model_dir, tmp_path, capsys):
    """`slick sft` generates nothing: its tok/s is the chats' trained (loss-mask) tokens over the step's seconds,
    in metrics.jsonl and on the progress line (it printed 0 tok/s on every step)."""
    train = tmp_path / "train.jsonl"
    train.write_text("".join(json.dumps(r) + "\n" for r in _chats(8, 0)))
    rc = main(["--hf-checkpoint", str(tiny_model_dir), "--prompt-data", str(train), "--rollout-batch-size", "4",
               "--num-rollout", "2", "--dtype", "fp32", "--run-dir", str(tmp_path / "run"), "--no-progress",
               "--no-rollout-store"])
    assert rc == 0
    rows = [json.loads(x) for x in (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()]
    rows = [r for r in rows if "perf/tokens_per_sec" in r]
    assert len(rows) == 2
    for r in rows:
        assert r["rollout/sft_trained_tokens"] > 0
        assert r["perf/tokens_per_sec"] > 0
        assert r["perf/tokens_per_sec"] == pytest.approx(r["rollout/sft_trained_tokens"] / r["perf/step_time"])
    shown = [line.split(" | ") for line in capsys.readouterr().err.splitlines() if line.startswith("step ")]
    rates = [float(p.split()[0]) for parts in shown for p in parts if p.endswith(" tok/s")]
    assert rates == [round(r["perf/tokens_per_sec"]) for r in rows] and all(x > 0 for x in rates)
