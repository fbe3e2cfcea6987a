"""`slick score --out` follows export's output rules (issue 50): a new file or one `slick score` wrote; never
the --data file (not even through a link); a directory, a missing directory or a file slick did not write is
refused by flag before any row is scored; nothing is left behind when a write fails."""
from __future__ import annotations

import json
import os

import pytest

from slick.cli import main as cli_main
from slick.ckpt.atomic_files import write_text_atomic

ROWS = [{"prompt": f"{i}+0?", "response": f"\\boxed{{{i}}}", "label": str(i)} for i in range(5)]


@pytest.fixture
def data(tmp_path):
    path = tmp_path / "rows.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in ROWS))
    return path


def score(*args) -> int:
    return cli_main(["score", "--rm-type", "math", "--evidence-chars", "0", *map(str, args)])


def refused(capsys, *args) -> str:
    assert score(*args) == 2
    out = capsys.readouterr()
    assert "rows of" not in out.out            # refused before any row was scored
    return out.err


def test_out_may_not_be_the_input(tmp_path, data, capsys):
    before = data.read_bytes()
    err = refused(capsys, "--data", data, "--out", data, "--limit", 2)
    assert f"--out {data} is the --data file" in err
    link = tmp_path / "link.jsonl"
    os.symlink(data, link)
    assert "is the --data file" in refused(capsys, "--data", data, "--out", link, "--limit", 2)
    hard = tmp_path / "hard.jsonl"
    os.link(data, hard)
    assert "is the --data file" in refused(capsys, "--data", data, "--out", hard)
    assert data.read_bytes() == before
    assert sorted(p.name for p in tmp_path.iterdir()) == ["hard.jsonl", "link.jsonl", "rows.jsonl"]


def test_out_directory_is_refused_by_flag(tmp_path, data, capsys):
    d = tmp_path / "outdir"
    d.mkdir()
    err = refused(capsys, "--data", data, "--out", d)
    assert f"--out {d}: is a directory; give a file path" in err
    assert sorted(p.name for p in tmp_path.iterdir()) == ["outdir", "rows.jsonl"] and not list(d.iterdir())
    err = refused(capsys, "--data", data, "--out", tmp_path / "missing" / "scored.jsonl")
    assert f"the directory {tmp_path / 'missing'} does not exist" in err


def test_a_file_slick_did_not_write_is_kept(tmp_path, data, capsys):
    notes = tmp_path / "notes.txt"
    notes.write_text("my notes\n")
    err = refused(capsys, "--data", data, "--out", notes)
    assert f"--out {notes}: exists and was not written by slick" in err
    assert notes.read_text() == "my notes\n"
    other = tmp_path / "other.jsonl"                      # JSON rows, but not scored ones
    other.write_text(json.dumps({"prompt": "p", "response": "r"}) + "\n")
    assert "was not written by slick" in refused(capsys, "--data", data, "--out", other)


def test_new_file_and_own_output_are_written(tmp_path, data, capsys):
    out = tmp_path / "scored.jsonl"
    assert score("--data", data, "--out", out, "--limit", 2) == 0
    assert [json.loads(line)["reward"] for line in out.read_text().splitlines()] == [1.0, 1.0]
    assert score("--data", data, "--out", out) == 0              # its own output: replaced
    assert len(out.read_text().splitlines()) == 5
    assert sorted(p.name for p in tmp_path.iterdir()) == ["rows.jsonl", "scored.jsonl"]
    capsys.readouterr()


def test_a_failed_write_leaves_nothing(tmp_path):
    target = tmp_path / "scored.jsonl"
    with pytest.raises(UnicodeEncodeError):
        write_text_atomic(target, "ok\n\ud800 cannot be encoded\n")
    assert list(tmp_path.iterdir()) == []
