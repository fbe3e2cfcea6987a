"""Tests for bench/trl_side.py: the reward rule (hand values) and, marked slow, one real TRL step."""
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


@pytest.mark.slow
@pytest.mark.timeout(900)
def test_run_trl_one_step_tiny_model(trl_side, tiny_model_dir, tmp_path):
    from slick.demo.addition import write_addition_data
    from slick.observe.metrics import read_metrics

    train, test = write_addition_data(tmp_path / "data", n_test=4)
    res = trl_side.run_trl(tiny_model_dir, train, test, steps=1, prompts_per_step=2, samples_per_prompt=2,
                           micro_batch_size=2, max_new_tokens=4, eval_every=1, out_dir=tmp_path / "out",
                           threads=1, log=lambda *_: None)
    assert res["num_steps"] == 1 and res["completions_per_step"] == 4
    (step,) = res["steps"]
    assert step["completions"] == 4 and 4 <= step["tokens"] <= 16  # 1..4 tokens each (EOS may stop early)
    assert [e["step"] for e in res["evals"]] == [0, 1]
    assert all(0.0 <= e["accuracy"] <= 1.0 for e in res["evals"])
    assert res["peak_rss_mb"] > 0 and res["step_time_mean_s"] > 0
    rows = read_metrics(tmp_path / "out")
    assert [r["step"] for r in rows] == [0, 1] and "rollout/raw_reward" in rows[1]
    assert json.loads((tmp_path / "out" / "trl_result.json").read_text())["num_steps"] == 1
