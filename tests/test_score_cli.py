"""`slick score` (issue 36): a table and per-row evidence from any reward, rows written back with --out,
bad rows named by file and line, as a real subprocess and in process."""
from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

from slick.cli import main as cli_main
from tests.sandbox_tools import make_pool

ROOT = Path(__file__).resolve().parent.parent


def write_rows(path: Path, rows) -> Path:
    path.write_text("".join((r if isinstance(r, str) else json.dumps(r)) + "\n" for r in rows))
    return path


def test_score_math_rows_in_process(tmp_path, capsys):
    data = write_rows(tmp_path / "rows.jsonl", [
        {"prompt": "1+1?", "response": "so \\boxed{2}", "label": "2"},
        {"prompt": "2+2?", "response": "it is 5", "label": "4"},
        {"prompt": "3+3?", "response": "6", "label": "6", "metadata": {"rm_type": "exact"}}])
    out = tmp_path / "scored.jsonl"
    assert cli_main(["score", "--rm-type", "math", "--data", str(data), "--out", str(out)]) == 0
    text = capsys.readouterr().out
    assert f"3 rows of {data}: mean reward 0.6667, verdict true 2, verifier failures 0" in text
    assert 'line 3: {"reward_type": "exact", "answer": "6", "verdict": true' in text
    scored = [json.loads(line) for line in out.read_text().splitlines()]
    assert [r["reward"] for r in scored] == [1.0, 0.0, 1.0]
    assert scored[0]["prompt"] == "1+1?" and scored[0]["evidence"]["answer"] == "2"
    assert scored[1]["evidence"]["reward_type"] == "math" and scored[1]["evidence"]["verdict"] is False


def test_bad_rows_name_file_and_line(tmp_path, capsys):
    data = write_rows(tmp_path / "bad.jsonl", [
        {"response": "a", "label": "a"}, "{not json", "[1, 2]", {"response": "x"}, "",
        {"response": "a", "label": "a", "metadata": 3}])
    assert cli_main(["score", "--rm-type", "exact", "--data", str(data)]) == 2
    err = capsys.readouterr().err
    assert f"{data}:2: not valid JSON" in err and f"{data}:3: expected a JSON object, got list" in err
    assert f"{data}:4: missing key(s) 'label'" in err and f"{data}:6: 'metadata' must be an object" in err
    assert f"{data}:1:" not in err


def test_unknown_reward_type_is_refused(tmp_path, capsys):
    data = write_rows(tmp_path / "rows.jsonl", [{"response": "a", "label": "a"}])
    assert cli_main(["score", "--rm-type", "nope", "--data", str(data)]) == 2
    assert "unknown reward type 'nope'" in capsys.readouterr().err


def test_score_code_rows_as_a_subprocess(tmp_path):
    make_pool(1)
    label = {"inputs": ["3"], "outputs": ["9"]}
    data = write_rows(tmp_path / "code.jsonl", [
        {"prompt": "square", "response": "```python\nprint(int(input()) ** 2)\n```", "label": label},
        {"prompt": "square", "response": "```python\nwhile True: pass\n```", "label": label}])
    out = tmp_path / "scored.jsonl"
    proc = subprocess.run([sys.executable, "-m", "slick.cli", "score", "--rm-type", "code", "--data", str(data),
                           "--out", str(out), "--sandbox-cpu-seconds", "1", "--sandbox-timeout", "3"],
                          cwd=ROOT, capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0, proc.stderr
    assert "mean reward 0.5000, verdict true 1, verifier failures 0" in proc.stdout
    scored = [json.loads(line) for line in out.read_text().splitlines()]
    assert [r["reward"] for r in scored] == [1.0, 0.0]
    assert scored[1]["evidence"]["tests"][0]["verdict"] == "time_limit"
    assert scored[0]["evidence"]["answer"] == "print(int(input()) ** 2)\n"


def test_custom_reward(tmp_path, capsys):
    data = write_rows(tmp_path / "rows.jsonl", [{"response": "abc", "label": 3}])
    assert cli_main(["score", "--custom-rm-path", "tests.test_score_cli.length_reward", "--data", str(data),
                     "--evidence-chars", "0"]) == 0
    text = capsys.readouterr().out
    assert "1 rows of" in text and "mean reward 1.0000" in text and "line 1:" not in text


def length_reward(args, sample):
    return {"reward": float(len(sample.response) == sample.label), "verdict": True}

