"""`slick check-template`: fuzzed conversations through a chat template, prefix-preserving or rewriting.

SmolLM2's own template and a plain ChatML one keep earlier turns as they were; a Qwen3-style thinking template
(tests/chat_templates.py: it drops the reasoning of earlier turns and gives the last turn an empty <think> block)
rewrites them, and the check names the turn and the messages. Then the CLI's exit codes on real directories."""
import json

import pytest

from slick.chat.template_check import check_conversation, check_template, check_template_cached, fuzz_conversation
from slick.cli import main as cli_main
from tests.chat_templates import COUNTING, DROPS_REASONING, QWEN3_THINKING, CHATML_PLAIN, QWEN_STYLE, tokenizer_with

CASES = 24

THINKING_TURNS = [{"role": "user", "content": "What is 2 + 2?"},
                  {"role": "assistant", "content": "<think>\nmaybe 4\n</think>\n\n4"},
                  {"role": "user", "content": "higher"},
                  {"role": "assistant", "content": "5"}]


@pytest.mark.parametrize("name,template", [("smollm2", None), ("chatml", CHATML_PLAIN), ("qwen", QWEN_STYLE)])
def test_prefix_preserving_templates_pass(name, template):
    report = check_template(tokenizer_with(template), cases=CASES)
    assert report.prefix_preserving and report.token_prefix_preserving, report.verdict()
    assert not report.errors and len(report.rendered) == CASES
    features = {f for c in report.cases for f in c.features}
    assert {"system", "tools", "reasoning"} <= features        # every kind of conversation was tried
    assert max(c.turns for c in report.cases) >= 4
    assert report.supports_tools == (name == "qwen")
    assert "prefix-preserving in all 24 conversations" in report.verdict()


def test_qwen3_thinking_template_rewrites_and_the_check_names_the_turn():
    tok = tokenizer_with(QWEN3_THINKING)
    report = check_template(tok, cases=CASES)
    assert not report.prefix_preserving and report.supports_tools
    assert 0 < len(report.rewrites) <= CASES
    for r in report.rewrites:   # what changes is always a <think> block the earlier rendering had
        assert r.kind == "text" and r.turn >= 1 and r.appended
        assert "think>" in r.shared[-8:] + r.earlier[:16] and "think>" not in r.shared[-8:] + r.later[:16]
    first = report.first_rewrite
    assert first is report.rewrites[0] and f"case {first.case}, turn {first.turn}" in report.verdict()
    # by hand: the reasoning of turn 1 is dropped when the next user message arrives, i.e. in turn 2's prompt
    case = check_conversation(tok, THINKING_TURNS)
    r = case.rewrite
    assert (r.turn, r.appended, r.roles) == (2, (2,), ("user",))
    assert r.earlier.startswith("<think>\nmaybe 4\n</think>") and r.later.startswith("4<|im_end|>\n<|im_start|>user")
    assert r.shared.endswith("<|im_start|>assistant\n")
    assert "case 0, turn 2: appending message 2 (user) for the prompt of turn 2" in r.describe()
    # a turn without reasoning is given an empty <think> block while it is the last, dropped once a tool answers
    tool_turn = [{"role": "user", "content": "add 2 and 3"},
                 {"role": "assistant", "content": "call <tool_call>x</tool_call>"},
                 {"role": "tool", "content": "5"}, {"role": "assistant", "content": "5"}]
    r = check_conversation(tok, tool_turn).rewrite
    assert (r.turn, r.roles) == (2, ("tool",)) and r.earlier.startswith("<think>\n\n</think>")


def test_other_rewrites_are_found_where_they_happen():
    drops = tokenizer_with(DROPS_REASONING)
    assert check_conversation(drops, THINKING_TURNS).rewrite.roles == ("user",)
    tool_only = [THINKING_TURNS[0], THINKING_TURNS[1], {"role": "tool", "content": "4"}, THINKING_TURNS[3]]
    assert check_conversation(drops, tool_only).rewrite is None   # it drops reasoning only for a new user turn
    counting = check_template(tokenizer_with(COUNTING), cases=4)
    assert len(counting.rewrites) == 4
    assert all(r.turn == 1 and r.roles == ("assistant",) for r in counting.rewrites)   # the policy's own turn
    assert "appending the policy's turn 1" in counting.first_rewrite.describe()


def test_fuzz_is_seeded_and_cached():
    tok = tokenizer_with(None)
    assert fuzz_conversation(9, 3, True) == fuzz_conversation(9, 3, True)
    assert fuzz_conversation(9, 3, True) != fuzz_conversation(9, 4, True)
    msgs, tools, _ = fuzz_conversation(2, 0, True)              # tools and tool results, with the schemas
    assert tools and any(m["role"] == "tool" for m in msgs) and msgs[-1]["role"] == "assistant"
    msgs, tools, _ = fuzz_conversation(2, 0, True, tool_role=False)
    assert tools is None and not any(m["role"] == "tool" for m in msgs)
    a = check_template(tok, cases=3, seed=5).to_dict()
    assert a == check_template(tok, cases=3, seed=5).to_dict() and json.loads(json.dumps(a))["prefix_preserving"]
    assert check_template_cached(tok, cases=3) is check_template_cached(tok, cases=3)


def test_a_template_that_raises_is_reported_not_fatal():
    tok = tokenizer_with("{{ raise_exception('no tools here') if messages | selectattr('role', 'equalto', 'tool') "
                         "| list else '' }}{% for m in messages %}{{ m['role'] + ': ' + m['content'] + '\\n' }}"
                         "{% endfor %}")
    report = check_template(tok, cases=6)
    assert not report.tool_role and not report.errors and report.prefix_preserving   # tool messages left out
    broken = tokenizer_with("{{ raise_exception('always') }}")
    report = check_template(broken, cases=2)
    assert len(report.errors) == 2 and "always" in report.errors[0].error and not report.rendered


# ------------------------------------------------------------------------------------------------- the CLI
@pytest.fixture(scope="module")
def model_dirs(tmp_path_factory):
    root = tmp_path_factory.mktemp("templates")
    out = {}
    for name, template in (("smollm2", None), ("qwen3", QWEN3_THINKING), ("none", "")):
        tok = tokenizer_with(template)
        if name == "none":
            tok.chat_template = None
        tok.save_pretrained(str(root / name))
        out[name] = root / name
    return out


def test_cli_exit_codes(model_dirs, capsys, tmp_path):
    assert cli_main(["check-template", str(model_dirs["smollm2"]), "--cases", "8"]) == 0
    out = capsys.readouterr().out
    assert "prefix-preserving in all 8 conversations" in out and "case  turns" in out
    assert cli_main(["check-template", str(model_dirs["qwen3"]), "--cases", "8", "--seed", "1"]) == 1
    out = capsys.readouterr().out
    assert "REWRITES earlier turns" in out and "rewrite t" in out and "first: case" in out
    assert cli_main(["check-template", str(model_dirs["qwen3"]), "--cases", "4", "--json"]) == 1
    report = json.loads(capsys.readouterr().out)
    assert report["prefix_preserving"] is False and report["rewrites"] >= 1 and len(report["cases"]) == 4
    assert report["cases"][0]["messages"][0]["role"] in ("system", "user")
    assert cli_main(["check-template", str(tmp_path / "missing")]) == 2
    assert "is not a directory" in capsys.readouterr().err
    assert cli_main(["check-template", str(model_dirs["none"])]) == 2
    assert "has no chat template" in capsys.readouterr().err
    assert cli_main(["check-template", str(model_dirs["smollm2"]), "--cases", "0"]) == 2
    assert "--cases must be at least 1" in capsys.readouterr().err
    (tmp_path / "empty").mkdir()
    assert cli_main(["check-template", str(tmp_path / "empty")]) == 2
    assert "cannot load a tokenizer" in capsys.readouterr().err
