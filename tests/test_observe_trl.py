"""Tests for bench/trl_side.py: the reward rule (hand values) and, marked slow, one real TRL step with a
model whose answers, rewards and accuracies are known."""
import importlib.util
import json
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


@pytest.fixture(scope="module")
def trl_side():
    spec = importlib.util.spec_from_file_location("trl_side", ROOT / "bench" / "trl_side.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def test_addition_reward_last_number(trl_side):
    r = trl_side.addition_reward
    assert r("The answer is 7.", "7") == 1.0
    assert r("3 + 4 = 7", "7") == 1.0            # last number counts
    assert r("7 is wrong, it is 8", "7") == 0.0
    assert r("#### 12 (not 3)", "12") == 1.0      # number after the last ####
    assert r("1,234", "1234") == 1.0
    assert r("7.0", "7") == 1.0
    assert r("no digits here", "7") == 0.0
    assert r("17", "7") == 0.0
    assert r("-3", "3") == 0.0


def test_read_jsonl_names_file_and_line(trl_side, tmp_path):
    p = tmp_path / "d.jsonl"
    p.write_text('{"prompt": "a", "label": "1"}\n{broken\n')
    with pytest.raises(ValueError, match=r"d.jsonl:2"):
        trl_side.read_jsonl(p)
    p.write_text('{"prompt": "a"}\n')
    with pytest.raises(ValueError, match=r"row 1 needs 'prompt' and 'label'"):
        trl_side.read_jsonl(p)


def make_always_seven_model(out_dir):
    """A tiny model that writes "7" at every position whatever the prompt: every input embedding has a
    constant 10 in dimension 0, which dominates the final RMSNorm, and the output head reads only that
    dimension, for token "7" (logit ~ 8 * 10 = 80 above every other token: the others are ~e^-80 likely)."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from slick.models.tiny import make_tiny_model

    d = make_tiny_model(out_dir, tie_word_embeddings=False)
    (seven,) = AutoTokenizer.from_pretrained(d).encode("7", add_special_tokens=False)
    m = AutoModelForCausalLM.from_pretrained(d, dtype=torch.float32)
    with torch.no_grad():
        m.get_input_embeddings().weight[:, 0] = 10.0
        head = m.get_output_embeddings().weight
        head.zero_()
        head[seven, 0] = 10.0
    m.save_pretrained(d)
    return d


def rss_mib(field):
    """VmRSS (current) or VmHWM (peak) of this process from /proc/self/status, in MiB."""
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith(field + ":"):
            return int(line.split()[1]) / 1024            # kB
    raise AssertionError(f"no {field} in /proc/self/status")


@pytest.mark.slow
@pytest.mark.timeout(900)
@pytest.mark.skipif(not Path("/proc/self/status").is_file(), reason="reads peak RSS from Linux /proc")
def test_run_trl_one_step_known_rewards(trl_side, tmp_path):
    """With a model that always answers "7777" (4 new tokens of "7"), every reward and accuracy is known."""
    import numpy as np

    from slick.demo.addition import write_jsonl
    from slick.observe.metrics import read_metrics

    model_dir = make_always_seven_model(tmp_path / "seven")
    chat = lambda q: [{"role": "user", "content": q}]                       # noqa: E731
    train = write_jsonl([{"prompt": chat(q), "label": "7777"} for q in ("7 * 1111?", "7770 + 7?", "7777 + 0?")],
                        tmp_path / "data" / "train.jsonl")
    # held out: 3 of 4 labels match the model's answer -> accuracy 0.75 before and after the step
    test = write_jsonl([{"prompt": chat(q), "label": y} for q, y in
                        [("7777?", "7777"), ("7000 + 777?", "7777"), ("1 + 7776?", "7,777"), ("3 + 4?", "7")]],
                       tmp_path / "data" / "test.jsonl")
    buf = np.ones(256 * 2**20, dtype=np.uint8)                  # 256 MiB, touched: the peak includes it
    rss_with_buf = rss_mib("VmRSS")
    assert rss_with_buf >= 256
    del buf
    res = trl_side.run_trl(model_dir, train, test, steps=1, prompts_per_step=2, samples_per_prompt=2,
                           micro_batch_size=2, max_new_tokens=4, eval_every=1, target_acc=0.75,
                           out_dir=tmp_path / "out", threads=1, log=lambda *_: None)
    assert res["num_steps"] == 1 and res["completions_per_step"] == 4
    (step,) = res["steps"]
    assert step["completions"] == 4 and step["tokens"] == 16           # 4 completions x 4 tokens, no EOS
    assert step["rollout/raw_reward"] == 1.0 and step["rollout/response_len/mean"] == 4.0
    t = step["perf/step_time"]
    assert step["perf/rollout_time"] + step["perf/train_time"] == pytest.approx(t, rel=1e-12)
    assert step["perf/tokens_per_sec"] == pytest.approx(16 / t, rel=1e-12)
    assert step["perf/completions_per_sec"] == pytest.approx(4 / t, rel=1e-12)
    assert [(e["step"], e["accuracy"]) for e in res["evals"]] == [(0, 0.75), (1, 0.75)]
    assert res["initial_accuracy"] == res["final_accuracy"] == 0.75
    assert res["time_to_target_s"] == 0.0                   # reached by the step-0 evaluation, before training
    assert res["step_time_mean_s"] == t and res["train_time_s"] == t
    assert res["tokens_per_sec"] == pytest.approx(16 / t, rel=1e-12)
    assert res["completions_per_sec"] == pytest.approx(4 / t, rel=1e-12)
    # peak RSS in MiB: at least the RSS while the buffer was held, at most the peak /proc reports afterwards (1 MiB
    # tolerance each side: the two are read at different moments and page-cache accounting moves by a fraction of a MiB)
    assert rss_with_buf - 1 <= res["peak_rss_mb"] <= rss_mib("VmHWM") + 1
    rows = read_metrics(tmp_path / "out")
    assert [r["step"] for r in rows] == [0, 1]
    assert rows[0]["eval/heldout"] == 0.75 and rows[1]["eval/heldout"] == 0.75
    assert rows[1]["rollout/raw_reward"] == 1.0 and rows[1]["rollout/response_len/mean"] == 4.0
    saved = json.loads((tmp_path / "out" / "trl_result.json").read_text())
    assert saved["num_steps"] == 1 and saved["evals"] == res["evals"] and saved["steps"] == res["steps"]
