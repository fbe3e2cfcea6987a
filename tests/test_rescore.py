"""`slick rescore`: the stored rollouts of a run paid by a lenient verifier, audited with gsm8k and with a
custom function, through the real RewardHub."""
import json
import textwrap

import pytest
import yaml

from slick.cli import main as slick
from tests.rollout_data import make_run


@pytest.fixture()
def run_dir(tmp_path):
    make_run(tmp_path)
    (tmp_path / "config.yaml").write_text(yaml.safe_dump({"reward": {"custom_rm_path": "lenient.says_answer",
                                                                     "rm_type": None}}))
    return tmp_path


def test_gsm8k_audit_finds_the_hacked_and_the_missed_samples(run_dir, tmp_path, capsys):
    out_json = tmp_path / "audit.json"
    assert slick(["rescore", str(run_dir), "--rm-type", "gsm8k", "--json", str(out_json), "--show", "2"]) == 0
    text = capsys.readouterr().out
    rep = json.loads(out_json.read_text())
    assert rep["samples"] == 16 and rep["steps"] == [1, 2]
    # per step: i = 2, 5 were paid for a wrong answer; i = 3, 7 were right but not paid
    assert rep["confusion"] == {"pass": {"pass": 8, "fail": 4, "error": 0},
                                "fail": {"pass": 4, "fail": 0, "error": 0},
                                "error": {"pass": 0, "fail": 0, "error": 0}}
    assert rep["agree"] == 8 and rep["disagree"] == 8
    assert rep["run_pass_new_fail"] == 4 and rep["run_fail_new_pass"] == 4
    assert rep["run_verifier"] == "lenient.says_answer" and rep["new_verifier"] == "gsm8k"
    assert rep["mean_reward_run"] == 0.75 and rep["mean_reward_new"] == 0.75
    hacked = [(d["index"], d["response"], d["label"]) for d in rep["disagreements"] if d["run_verdict"] == "pass"]
    assert hacked == [(2, "the answer is 14", "13"), (5, "the answer is 17", "16"),
                      (10, "the answer is 15", "14"), (13, "the answer is 18", "17")]
    first = rep["disagreements"][0]
    assert first["new_evidence"]["answer"] == "14" and first["new_evidence"]["verdict"] is False
    assert first["new_evidence"]["reward_type"] == "gsm8k"
    assert "agree 8, disagree 8 (50.0%): 4 paid by the run but failed by gsm8k" in text
    assert "run: pass        8       4       0" in text
    assert "disagreeing samples (2 of 8)" in text and "step 1 sample 2 group 1: run 1.0 (pass) vs gsm8k 0.0" in text


def test_custom_verifier_step_filter_and_failures(run_dir, tmp_path, capsys, monkeypatch):
    (tmp_path / "strict_rm.py").write_text(textwrap.dedent('''
        def last_number(args, sample):
            if sample.index == 9:
                raise RuntimeError("verifier crashed")
            return float(sample.response.split()[-1] == sample.label)
    '''))
    monkeypatch.syspath_prepend(str(tmp_path))
    out_json = tmp_path / "audit.json"
    assert slick(["rescore", str(run_dir), "--custom-rm-path", "strict_rm.last_number", "--step", "2",
                  "--json", str(out_json)]) == 0
    rep = json.loads(out_json.read_text())
    assert rep["samples"] == 8 and rep["steps"] == [2]
    assert rep["confusion"]["pass"] == {"pass": 3, "fail": 2, "error": 1}     # sample 9: the verifier failed
    assert rep["confusion"]["fail"] == {"pass": 2, "fail": 0, "error": 0}
    crashed = [d for d in rep["disagreements"] if d["index"] == 9][0]
    assert "verifier crashed" in crashed["new_error"] and crashed["new_reward"] is None


def test_errors(tmp_path, run_dir, capsys):
    assert slick(["rescore", str(tmp_path / "nothing"), "--rm-type", "gsm8k"]) == 2
    assert "no such run directory" in capsys.readouterr().err
    assert slick(["rescore", str(run_dir), "--rm-type", "nonsense"]) == 2
    assert "unknown reward type 'nonsense'" in capsys.readouterr().err
    with pytest.raises(SystemExit):                       # one verifier is required
        slick(["rescore", str(run_dir)])
