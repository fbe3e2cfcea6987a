"""examples/: the calculator and search tools, their data generators, and each README's `slick train` command
(one step with the tiny model, as a real subprocess); the agent demo's driver with the tiny model."""
import json
import math
import os
import re
import shlex
import subprocess
import sys
from fractions import Fraction
from pathlib import Path

import pytest

from examples.search.bm25 import BM25, tokenize
from examples.search.corpus import build_corpus
from examples.search.make_data import search_rows
from examples.search.tool import search
from slick.demo.calculator import (CALCULATOR_SCHEMA, EXAMPLE, CalculatorError, calculator, calculator_rows,
                                   evaluate, final_answer_reward, parse_expression_call)
from slick.types import Sample

ROOT = Path(__file__).resolve().parent.parent


# ---------------------------------------------------------------- calculator tool
@pytest.mark.parametrize("expr, want", [
    ("347 * 28", "9716"), ("(2 + 3) * 4", "20"), ("7 / 2", "3.5"), ("1 / 3", "0.333333"), ("2 ** 10", "1024"),
    ("-5 + 2", "-3"), ("17 // 5", "3"), ("17 % 5", "2"), ("1.5 * 4", "6"), ("12 × 3", "36"), ("1,234 + 1", "1235"),
    ("99 * 99 =", "9801"), ("2 ** -2", "0.25"), ("(((1)))", "1"), ("-" * 150 + "1", "1"),
])
def test_calculator_values(expr, want):
    assert calculator(expr) == want


def test_evaluate_is_exact():
    assert evaluate("1/3 + 1/6") == Fraction(1, 2)
    assert evaluate("0.1 + 0.2") == Fraction(3, 10)


@pytest.mark.parametrize("expr, needle", [
    ("__import__('os').system('true')", "unsupported syntax: Call"), ("a + 1", "unsupported syntax: Name"),
    ("'x' * 3", "unsupported syntax"), ("1 / 0", "division by zero"), ("5 % 0", "division by zero"),
    ("2 ** 1000", "exponent"), ("9 ** 9 ** 9", "exponent"), ("10 ** 50", "too large"), ("", "empty"),
    ("1 +", "not an arithmetic expression"), ("1" * 201, "longer than 200"), ("(1", "not an arithmetic expression"),
    ("[1]", "unsupported syntax: List"), ("2 ** 0.5", "whole number"),
])
def test_calculator_refuses(expr, needle):
    with pytest.raises(CalculatorError, match=re.escape(needle)):
        calculator(expr)


def test_calculator_refuses_non_string():
    with pytest.raises(CalculatorError, match="must be a string"):
        calculator(12)


# ---------------------------------------------------------------- calculator data and reward
def test_calculator_rows_split_and_labels():
    train, test = calculator_rows(n_train=300, n_test=40, seed=3)
    assert len(train) == 300 and len(test) == 40
    key = lambda r: (r["metadata"]["a"], r["metadata"]["b"])  # noqa: E731
    assert not {key(r) for r in train} & {key(r) for r in test}
    assert len({key(r) for r in train}) == 300
    for r in train + test:
        a, b = key(r)
        assert 100 <= a <= 999 and 10 <= b <= 99
        assert r["label"] == str(a * b) and r["tools"] == [CALCULATOR_SCHEMA]
        assert r["prompt"][-1] == {"role": "user", "content": f"What is {a} * {b}?"}
        assert [m["role"] for m in r["prompt"]] == ["system", "user", "assistant", "tool", "assistant", "user"]
    shot = train[0]["prompt"]
    assert shot[1]["content"] == "What is %d + %d?" % EXAMPLE
    [call] = parse_expression_call(shot[2]["content"])
    assert calculator(**call.arguments) == shot[3]["content"] == shot[4]["content"] == str(sum(EXAMPLE))
    assert calculator_rows(n_train=300, n_test=40, seed=3) == (train, test)
    with pytest.raises(ValueError, match="only"):
        calculator_rows(n_train=100, n_test=0, digits=(1, 1))


@pytest.mark.parametrize("text, expression", [
    ("158 * 97", "158 * 97"), ("949 * 66\nThe original problem", "949 * 66"), ("(12+3)*4", "(12+3)*4"),
    ("  6.6 x 15 ", "6.6 x 15"), ("5535", None), ("712 * 56 = 3528", None), ("The answer is 4 * 5", None), ("", None),
    ('<tool_call>{"name": "calculator", "arguments": {"expression": "2 * 3"}}</tool_call>', "2 * 3"),
])
def test_parse_expression_call(text, expression):
    calls = parse_expression_call(text)
    if expression is None:
        assert calls == []
    else:
        assert [(c.name, c.arguments, c.error) for c in calls] == [("calculator", {"expression": expression}, None)]


def _multiturn_sample(label, turns):
    msgs = [{"role": "user", "content": "q"}] + [
        {"role": role, "content": text} for role, text in turns]
    return Sample(label=label, response="".join(t for _, t in turns), metadata={"multiturn": {"messages": msgs}})


def test_final_answer_reward_reads_the_last_assistant_turn():
    call = '<tool_call>{"name": "calculator", "arguments": {"expression": "2 * 3"}}</tool_call>'
    assert final_answer_reward(None, _multiturn_sample("6", [("assistant", call), ("tool", "6"),
                                                                ("assistant", "The answer is 6.")])) == 1.0
    # the product only in the tool's message: no reward
    assert final_answer_reward(None, _multiturn_sample("6", [("assistant", call), ("tool", "6"),
                                                                ("assistant", "done")])) == 0.0
    assert final_answer_reward(None, _multiturn_sample("6", [("assistant", call), ("tool", "6"),
                                                                ("assistant", "7")])) == 0.0
    assert final_answer_reward(None, Sample(label="6", response="it is 6")) == 1.0  # single-turn sample


# ---------------------------------------------------------------- BM25 and the search tool
def test_bm25_scores_by_hand():
    docs = ["red apple", "green apple pie", "blue sky"]
    index = BM25(docs, k1=1.5, b=0.75)
    avgdl = 7 / 3
    idf_apple = math.log(1 + (3 - 2 + 0.5) / (2 + 0.5))
    want0 = idf_apple * 1 * 2.5 / (1 + 1.5 * (1 - 0.75 + 0.75 * 2 / avgdl))
    want1 = idf_apple * 1 * 2.5 / (1 + 1.5 * (1 - 0.75 + 0.75 * 3 / avgdl))
    assert index.scores("apple") == pytest.approx([want0, want1, 0.0], rel=1e-12)
    assert index.top("apple", 5) == [(0, pytest.approx(want0)), (1, pytest.approx(want1))]
    assert index.top("pie apple", 1)[0][0] == 1
    assert index.top("nothing here") == []
    assert tokenize("Hello, World-42!") == ["hello", "world", "42"]
    with pytest.raises(ValueError, match="at least one document"):
        BM25([])


def test_every_question_is_answered_by_the_top_passage():
    train, test = search_rows()
    docs = build_corpus()
    assert len(test) == 40 and len(train) == 360
    assert not {r["metadata"]["doc_id"] for r in train} & {r["metadata"]["doc_id"] for r in test}
    for row in train + test:
        doc = docs[row["metadata"]["doc_id"]]
        assert row["label"] == str(doc[row["metadata"]["kind"]])
        top = search(row["prompt"][-1]["content"], top_k=1)
        assert top == doc["text"], row["prompt"][-1]["content"]
    assert len({d["name"] for d in docs}) == 200 and build_corpus() == docs


def test_search_tool_edges():
    assert search("zzzz qqqq") == "no results"
    assert search("   ").startswith("error:")
    assert len(search("population", top_k=3).splitlines()) == 3
    assert len(search("population", top_k=99).splitlines()) == 3


# ---------------------------------------------------------------- the README commands, one step each
def readme_commands(example: str) -> list[str]:
    text = (ROOT / "examples" / example / "README.md").read_text(encoding="utf-8")
    block = re.search(r"```bash\n(.*?)```", text, re.S).group(1)
    joined = block.replace("\\\n", " ")
    return [line.strip() for line in joined.splitlines() if line.strip() and not line.strip().startswith("#")]


def run_readme(example: str, model_dir: Path, tmp_path: Path) -> list[dict]:
    data = tmp_path / "data"
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1"}
    cmds = readme_commands(example)
    assert len(cmds) == 2 and cmds[0].startswith(f"python -m examples.{example}.make_data")
    for cmd in cmds:
        cmd = cmd.replace(f"data/{example}", str(data)).replace("MODEL_DIR", str(model_dir))
        cmd = cmd.replace("test.jsonl", "test.jsonl@[0:4]")  # 4 held-out questions are enough here
        argv = shlex.split(cmd)
        while "=" in argv[0]:  # leading VAR=value assignments
            name, _, value = argv.pop(0).partition("=")
            env[name] = str(ROOT) if value == "." else value
        if argv[0] == "python":
            argv[0] = sys.executable
        elif argv[0] == "slick":
            argv = [str(Path(sys.executable).parent / "slick")] + argv[1:] + [
                "--num-rollout", "1", "--rollout-batch-size", "2", "--n-samples-per-prompt", "2",
                "--micro-batch-size", "4", "--n-samples-per-eval-prompt", "1", "--eval-interval", "1",
                "--run-dir", str(tmp_path / "run"), "--no-progress"]
        proc = subprocess.run(argv, cwd=ROOT, env=env, capture_output=True, text=True, timeout=600)
        assert proc.returncode == 0, f"{cmd}\n{proc.stdout[-2000:]}\n{proc.stderr[-4000:]}"
    return [json.loads(x) for x in (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()]


@pytest.mark.slow
@pytest.mark.parametrize("example", ["calculator", "search"])
def test_readme_command_runs_one_step(example, tiny_model_dir, tmp_path):
    rows = run_readme(example, tiny_model_dir, tmp_path)
    step = [r for r in rows if "train/loss" in r]
    assert len(step) == 1 and step[0]["step"] == 1
    assert step[0]["rollout/turns/mean"] >= 1.0 and "rollout/tool_calls/mean" in step[0]
    assert [r["step"] for r in rows if "eval/heldout" in r] == [0, 1]


# ---------------------------------------------------------------- the agent demo's driver, tiny model
def test_agent_demo_driver_one_step(tiny_model_dir, tmp_path):
    """`python -m slick.demo agent` end to end with the tiny model in place of SmolLM2: the no-tool evaluation,
    one GRPO step through the multi-turn tool rollout, the table, the plot, the summary and the results files."""
    from slick.demo.__main__ import main
    from slick.demo.agent import N_TEST, write_results

    run_dir = tmp_path / "agent"
    rc = main(["agent", "--hf-checkpoint", str(tiny_model_dir), "--num-rollout", "1", "--rollout-batch-size", "2",
               "--n-samples-per-prompt", "2", "--micro-batch-size", "4", "--run-dir", str(run_dir), "--no-progress"])
    assert rc == 0
    summary = json.loads((run_dir / "summary.json").read_text())
    assert [r["step"] for r in summary["eval"]] == [0, 1]
    assert 0.0 <= summary["no_tool_accuracy"] <= 1.0
    assert summary["argv"][summary["argv"].index("--hf-checkpoint") + 1] == str(tiny_model_dir)
    assert len((run_dir / "data" / "test.jsonl").read_text().splitlines()) == N_TEST
    rows = [json.loads(x) for x in (run_dir / "metrics.jsonl").read_text().splitlines()]
    step = [r for r in rows if "train/loss" in r]
    assert len(step) == 1 and step[0]["rollout/turns/mean"] >= 1.0
    out_json, out_md = write_results(run_dir, tmp_path / "results", tmp_path / "img" / "agent.png", "test")
    assert json.loads(out_json.read_text())["steps"][0]["step"] == 1
    assert "| 0 | " in out_md.read_text() and (tmp_path / "img" / "agent.png").stat().st_size > 0
