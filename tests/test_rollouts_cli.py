"""`slick rollouts RUN_DIR`: filters, table, --show with tokens, clear errors; through the real `slick` entry point."""
import json
import subprocess
import sys

import pytest

from slick.cli import main as slick
from tests.rollout_data import make_run


@pytest.fixture()
def run_dir(tmp_path):
    make_run(tmp_path)
    return tmp_path


def lines_of(capsys):
    out = capsys.readouterr().out.splitlines()
    return out[2:]                                    # header and rule


def test_table_lists_every_sample_in_step_order(run_dir, capsys):
    assert slick(["rollouts", str(run_dir), "--limit", "0"]) == 0
    rows = lines_of(capsys)
    assert len(rows) == 16
    assert [int(r.split()[1]) for r in rows] == list(range(16))
    assert rows[0].split()[:5] == ["1", "0", "0", "1", "16"]   # step index group reward len
    assert rows[0].endswith("the answer is 11")


@pytest.mark.parametrize("flags, indices", [
    (["--step", "2"], list(range(8, 16))),
    (["--max-reward", "0.5"], [3, 7, 11, 15]),
    (["--min-reward", "1", "--step", "1"], [0, 1, 2, 4, 5, 6]),
    (["--max-len", "2"], [3, 7, 11, 15]),
    (["--min-len", "3", "--max-reward", "0"], []),
    (["--contains", "is 17"], [5, 6]),                # 5 + 11 + 1 (a wrong answer) and 6 + 11
    (["--limit", "3"], [0, 1, 2]),
])
def test_filters(run_dir, capsys, flags, indices):
    assert slick(["rollouts", str(run_dir), "--json", "--limit", "0", *flags]) == 0   # a later --limit wins
    got = [json.loads(line)["index"] for line in capsys.readouterr().out.splitlines()]
    assert got == indices


def test_sort_by_reward_descending_then_index(run_dir, capsys):
    assert slick(["rollouts", str(run_dir), "--json", "--sort", "reward", "--desc", "--step", "1"]) == 0
    got = [json.loads(line) for line in capsys.readouterr().out.splitlines()]
    assert [r["reward"] for r in got] == [1.0] * 6 + [0.0] * 2
    assert [r["index"] for r in got] == [0, 1, 2, 4, 5, 6, 3, 7]


def test_show_prints_tokens_with_mask_logprob_and_version(run_dir, capsys):
    assert slick(["rollouts", str(run_dir), "--show", "13"]) == 0
    out = capsys.readouterr().out
    assert "sample 13  step 2  group 6" in out
    assert "the answer is 18" in out                  # 5 + 12 + 1: the wrong answer with a tool turn
    tokens = out.split("--- tokens")[1].splitlines()[2:]
    assert len(tokens) == len("the answer is 18")
    cells = [t.split() for t in tokens]
    assert [c[2] for c in cells[:6]] == ["1", "1", "0", "0", "0", "1"]   # the tool's tokens: mask 0
    assert cells[1] == ["1", str(ord("h")), "1", "-0.1000", "1", "'h'"]


def test_errors_name_the_store(tmp_path, capsys):
    assert slick(["rollouts", str(tmp_path)]) == 2
    assert f"{tmp_path / 'rollouts'}: no rollout store here" in capsys.readouterr().err
    (tmp_path / "rollouts").mkdir()
    assert slick(["rollouts", str(tmp_path)]) == 2
    assert "empty" in capsys.readouterr().err
    make_run(tmp_path)
    assert slick(["rollouts", str(tmp_path), "--show", "99"]) == 2
    assert "sample index 99 is not in any stored step" in capsys.readouterr().err


def test_console_script_runs(run_dir):
    out = subprocess.run([sys.executable, "-m", "slick.cli", "rollouts", str(run_dir), "--step", "2", "--limit", "1"],
                         capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    assert out.stdout.splitlines()[2].split()[:2] == ["2", "8"]
