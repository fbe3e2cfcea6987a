"""Issue 30, finding 6: policy-written text can neither hang nor crash the run.

The calculator bounds every intermediate result (and refuses a power before computing it), the Hermes parser
is linear in the turn's length and bounds JSON nesting, a parser plug-in that raises answers with an error tool
message, and a multi-turn rollout (real RolloutManager, MultiTurnRollout, ToolSet, chat template and tokenizer;
a scripted engine writes the policy's turns) goes on past hostile turns to its end.
"""
import asyncio
import json
import time
from fractions import Fraction

import pytest

from examples.search.tool import MAX_QUERY_CHARS, search
from slick.config import Config
from slick.configure.validate import validate_config
from slick.data.source import DataSource
from slick.demo.calculator import CalculatorError, calculator, evaluate, parse_expression_call
from slick.serve.openai_protocol import split_tool_calls
from slick.reward.hub import RewardHub
from slick.chat import safejson
from slick.rollout.manager import RolloutManager
from slick.chat.toolcall import get_parser, parse_hermes, strip_tool_calls
from slick.types import Generation, Status
from tests.chat_templates import tokenizer_with

DEEP = "<tool_call>" + "[" * 1200 + "</tool_call>"
DEEP_ERROR = f"tool call refused: nested 1200 levels deep, more than 64 allowed: {('[' * 1200)[:200]!r}"
TOO_PRECISE = "result too precise (its exact fraction needs more than 4096 bits)"
EXPONENT = "exponent must be a whole number of at most 64"


def best_time(fn, *args, repeat=3):
    """The fastest of ``repeat`` runs of ``fn(*args)`` (seconds): robust to a busy machine."""
    best = float("inf")
    for _ in range(repeat):
        t0 = time.perf_counter()
        fn(*args)
        best = min(best, time.perf_counter() - t0)
    return best


# ---------------------------------------------------------------- the calculator
@pytest.mark.parametrize("expr, message", [
    ("((1.0000001 ** 64) ** 64) ** 64", TOO_PRECISE),          # took 118 s: a 6.1M-bit fraction
    ("(1.0000001 ** 64) ** 64", TOO_PRECISE),
    ("(0.9999999 ** 64) ** 3", TOO_PRECISE),
    ("(1 / 3 ** 64) ** 64", TOO_PRECISE),
    ("1e-300 ** 14", TOO_PRECISE),
    ("*".join(["1.0000001**64"] * 3), TOO_PRECISE),                    # each factor fits, the product does not
    ("10 ** 10 ** 10", EXPONENT), ("9 ** 9 ** 9", EXPONENT), ("2 ** 100000000", EXPONENT),
    ("(2 ** 64) ** 64", "result too large"), ("((99 ** 20) ** 2) ** 2", "result too large"),
    ("99 ** 20 * 98 ** 20 * 97 ** 20 * 96 ** 20", "result too large"),
    ("1e999", "result too large"), ("1e308 * 1e308", "result too large"),
    ("9" * 200, "result too large"), ("9" * 5000, "expression longer than 200 characters"),
    ("(" * 100 + "1" + ")" * 100, "expression longer than 200 characters"),
    ("(" * 199 + "1", "not an arithmetic expression: " + repr("(" * 199 + "1")),
])
def test_calculator_refuses_hostile_expressions_fast(expr, message):
    t0 = time.perf_counter()
    with pytest.raises(CalculatorError) as info:
        calculator(expr)
    assert time.perf_counter() - t0 < 0.2
    assert str(info.value) == message


@pytest.mark.parametrize("expr, want", [
    ("347 * 28", "9716"), ("7 / 2", "3.5"), ("1 / 3", "0.333333"), ("2 ** -2", "0.25"), ("2 ** 64", str(2 ** 64)),
    ("1.0000001 ** 64", "1.000006"), ("(0.9999999 ** 64) ** 2", "0.999987"), ("1.1 ** 64", "445.791568"),
    ("(" * 99 + "1" + ")" * 99, "1"), ("-" * 199 + "1", "-1"), ("99 ** 20", str(99 ** 20)),
])
def test_calculator_results_unchanged(expr, want):
    t0 = time.perf_counter()
    assert calculator(expr) == want
    assert time.perf_counter() - t0 < 0.2


def test_calculator_stays_exact():
    assert evaluate("1.0000001 ** 64") == Fraction(10000001, 10 ** 7) ** 64
    assert evaluate("(0.9999999 ** 64) ** 2") == Fraction(9999999, 10 ** 7) ** 128
    assert evaluate("1/3 + 1/7 - 1/21") == Fraction(3, 7)


# ---------------------------------------------------------------- the Hermes parser
def test_deep_nesting_is_a_parse_error_not_a_recursion_error():
    (call,) = parse_hermes(DEEP)                       # raised RecursionError before
    assert (call.name, call.arguments, call.error) == ("", {}, DEEP_ERROR)
    nested_args = '<tool_call>{"name": "f", "arguments": "' + "[" * 1200 + '"}</tool_call>'
    (call,) = parse_hermes(nested_args)
    assert call.error == f"arguments of 'f' refused: nested 1200 levels deep, more than 64 allowed: " \
                         f"{('[' * 1200)[:200]!r}"
    # 64 levels are fine; brackets inside strings do not count
    ok = '{"name": "f", "arguments": {"x": ' + "[" * 62 + "]" * 62 + ', "s": "' + "[" * 500 + '"}}'
    (call,) = parse_hermes(f"<tool_call>{ok}</tool_call>")
    assert call.error is None and call.arguments["s"] == "[" * 500
    assert call.arguments["x"] == json.loads("[" * 62 + "]" * 62)         # 2 + 62 = 64 levels


def test_huge_integer_is_a_parse_error():
    body = '{"name": "f", "arguments": {"x": ' + "1" * 5000 + "}}"
    (call,) = parse_hermes(f"<tool_call>{body}</tool_call>")   # raised ValueError before
    assert call.error == f"tool call refused: an integer has 5000 digits, more than 4300 allowed: {body[:200]!r}"


def test_invalid_json_message_unchanged():
    (call,) = parse_hermes("<tool_call>{not json}</tool_call>")
    assert call.error == "tool call is not valid JSON (Expecting property name enclosed in double quotes at " \
                         "column 2): '{not json}'"


def test_safejson_depth_skips_strings():
    assert safejson.depth('[{"a": "]]]]][[[[", "b": [1, "\\"[["]}]') == 3
    assert safejson.depth('"unterminated [[[[') == 0
    with pytest.raises(safejson.JSONLimitError, match="nested 65 levels deep, more than 64 allowed"):
        safejson.loads("[" * 65 + "]" * 65)
    assert safejson.loads("[" * 64 + "]" * 64) == json.loads("[" * 64 + "]" * 64)


def test_unclosed_tags_parse_in_linear_time():
    text = "<tool_call>" * 20_000
    calls = parse_hermes(text)
    assert [c.error for c in calls] == ["unclosed <tool_call> (no </tool_call> before the turn ended)"]
    t20 = best_time(parse_hermes, text)
    assert t20 < 0.5                                   # 20.6 s before
    # doubling: many closed calls and an unclosed tail, the shape that made the regex rescan
    one = '<tool_call>{"name": "f", "arguments": {}}</tool_call>'
    small, big = one * 10_000 + "<tool_call>" * 20_000, one * 20_000 + "<tool_call>" * 40_000
    assert len(parse_hermes(small)) == 10_001
    ratio = best_time(parse_hermes, big) / best_time(parse_hermes, small)
    assert ratio < 3, ratio
    ratio = best_time(parse_hermes, "<tool_call>" * 40_000) / best_time(parse_hermes, "<tool_call>" * 20_000)
    assert ratio < 3, ratio


def test_closing_tag_inside_a_json_string_does_not_end_the_call():
    # a forced get_time call SmolLM2 wrote at T=1 (issue 58): the grammar lets a string hold the closing tag
    text = '<tool_call>\n{"name": "get_time", "arguments": {"tz": "]}</tool_call> 1"}}\n</tool_call>'
    (call,) = parse_hermes(text)
    assert (call.name, call.arguments, call.error) == ("get_time", {"tz": "]}</tool_call> 1"}, None)
    assert strip_tool_calls(text + " after") == " after"
    escaped = '<tool_call>{"name": "f", "arguments": {"s": "\\"}</tool_call>"}}</tool_call>'
    assert [(c.name, c.arguments) for c in parse_hermes(escaped)] == [("f", {"s": '"}</tool_call>'})]
    # a string that never closes: bodies end at the first closing tag again, and parsing stays linear
    hostile = lambda n: '<tool_call>{"' + '</tool_call><tool_call>{"' * n
    assert len(parse_hermes(hostile(3))) == 4
    ratio = best_time(parse_hermes, hostile(40_000)) / best_time(parse_hermes, hostile(20_000))
    assert ratio < 3, ratio


def test_same_calls_as_before_on_ordinary_text():
    text = 'a <tool_call>{"name": "add", "arguments": {"a": 1}}</tool_call> b <tool_call><tool_call>' \
           '{"name": "x"}</tool_call> c </tool_call> d <tool_call>{"na'
    calls = parse_hermes(text)
    assert [(c.name, c.arguments) for c in calls] == [("add", {"a": 1}), ("", {}), ("", {})]
    assert calls[1].error.startswith("tool call is not valid JSON (Expecting value at column 1): '<tool_call>")
    assert calls[2].error == "unclosed <tool_call> (no </tool_call> before the turn ended)"
    assert strip_tool_calls(text) == "a  b  c </tool_call> d <tool_call>{\"na"


def test_agent_endpoint_split_is_linear():
    text = '<tool_call>{"name": "f", "arguments": {}}</tool_call>' + "<tool_call>" * 20_000
    parse = get_parser("hermes")
    t0 = time.perf_counter()
    content, calls = split_tool_calls(text, parse)     # re.sub rescanned every unclosed tag: ~20 s
    assert time.perf_counter() - t0 < 0.5
    assert content == "<tool_call>" * 20_000
    assert [c["function"] for c in calls] == [{"name": "f", "arguments": "{}"}]


def test_expression_call_parser_on_hostile_text():
    t0 = time.perf_counter()
    assert parse_expression_call("1" * 100_000 + " +") != []
    assert parse_expression_call("(" * 100_000) == []
    assert [c.error for c in parse_expression_call(DEEP)] == [DEEP_ERROR]
    assert time.perf_counter() - t0 < 0.5


# ---------------------------------------------------------------- parser plug-ins that break
def recursive_parser(text):
    """A naive plug-in: json.loads on whatever follows the tag (RecursionError on deep nesting)."""
    if "<tool_call>" not in text:
        return []
    return [json.loads(text.split("<tool_call>", 1)[1].split("</tool_call>", 1)[0])]


def string_args_parser(text):
    return [{"name": "calculator", "arguments": "2 + 2"}]


def test_a_plugin_that_raises_gives_an_error_call():
    (call,) = get_parser("tests.test_security_parsers:recursive_parser")(DEEP)
    assert call.name == "" and call.error.startswith(
        "the tool call could not be parsed (--tool-parser 'tests.test_security_parsers:recursive_parser' raised "
        "RecursionError: maximum recursion depth exceeded")
    (call,) = get_parser("tests.test_security_parsers:string_args_parser")("x")
    assert (call.name, call.arguments, call.error) == ("calculator", {}, "arguments of 'calculator' must be a "
                                                                         "JSON object, got str")


# ---------------------------------------------------------------- the search example tool
def test_search_refuses_long_queries_fast():
    search("warmup")
    query = "population river mayor " * 400
    t0 = time.perf_counter()
    assert search(query) == f"error: query longer than {MAX_QUERY_CHARS} characters (got {len(query)})"
    assert time.perf_counter() - t0 < 0.1
    t0 = time.perf_counter()
    assert search(("population river mayor " * 100)[:MAX_QUERY_CHARS]).count("\n") == 1
    assert time.perf_counter() - t0 < 0.1


# ---------------------------------------------------------------- a multi-turn rollout with hostile turns
HUGE = '<tool_call>{"name": "calculator", "arguments": {"expression": "((1.0000001 ** 64) ** 64) ** 64"}}' \
       '</tool_call>'
GOOD = '<tool_call>{"name": "calculator", "arguments": {"expression": "347 * 28"}}</tool_call>'


class ScriptedEngine:
    """Writes the policy's turns from a script, by how many tool messages the conversation holds so far."""

    def __init__(self, tok, turns):
        self.tok, self.turns, self.calls = tok, turns, 0

    async def generate(self, prompt_ids, sampling, rid=None):
        self.calls += 1
        seen = self.tok.decode(prompt_ids, skip_special_tokens=False).count("<|im_start|>tool")
        ids = self.tok(self.turns[min(seen, len(self.turns) - 1)], add_special_tokens=False)["input_ids"]
        ids = ids + [self.tok.eos_token_id]
        assert len(ids) <= sampling.max_new_tokens
        return Generation(token_ids=ids, logprobs=[-0.5] * len(ids), finish_reason="stop")

    async def abort_all(self):
        pass


def run_rollout(tok, engine, **kw):
    base = dict(hf_checkpoint="unused", dtype="fp32", device="cpu", seed=7, rollout_batch_size=1,
                n_samples_per_prompt=2, rm_type=None, custom_rm_path="slick.demo.calculator.final_answer_reward",
                rollout_max_response_len=3000, max_turns=4, tool_path="slick.demo.calculator:TOOLS",
                tool_timeout=30.0)
    base.update(kw)
    cfg = Config.from_flat(base)
    cfg = validate_config(cfg, check_files=False) or cfg
    msgs = [{"role": "user", "content": "What is 347 * 28?"}]
    text = tok.apply_chat_template(msgs, add_generation_prompt=True, tokenize=False)
    rows = [{"prompt_index": 0, "prompt": msgs, "label": "9716", "metadata": {},
             "prompt_ids": tok(text, add_special_tokens=False)["input_ids"]}]
    manager = RolloutManager(cfg, DataSource(rows, cfg.n_samples_per_prompt), engine, RewardHub(cfg), tok)
    groups, metrics = asyncio.run(manager.generate_rollout(0))
    return [s for g in groups for s in g], metrics


def test_rollout_goes_on_past_hostile_tool_calls():
    tok = tokenizer_with(None)
    engine = ScriptedEngine(tok, [DEEP, HUGE, GOOD, "The answer is 9716."])
    t0 = time.perf_counter()
    samples, metrics = run_rollout(tok, engine)
    assert time.perf_counter() - t0 < 20
    assert len(samples) == 2 and engine.calls == 8
    for s in samples:
        st = s.metadata["multiturn"]
        assert s.status == Status.COMPLETED
        assert (st["turns"], st["tool_calls"], st["tool_errors"]) == (4, 3, 2)
        tool_msgs = [m["content"] for m in st["messages"] if m["role"] == "tool"]
        assert tool_msgs == [f"Error: {DEEP_ERROR}",
                             f"Error: tool 'calculator' raised CalculatorError: {TOO_PRECISE}", "9716"]
        assert s.reward == 1.0
        assert sum(s.loss_mask) == sum(len(tok(t, add_special_tokens=False)["input_ids"]) + 1
                                       for t in engine.turns)
    assert metrics["rollout/tool_errors"] == 4


def test_rollout_goes_on_when_a_parser_plugin_raises():
    tok = tokenizer_with(None)
    engine = ScriptedEngine(tok, [DEEP, "The answer is 9716."])
    samples, metrics = run_rollout(tok, engine, max_turns=2,
                                   tool_parser="tests.test_security_parsers:recursive_parser")
    for s in samples:
        st = s.metadata["multiturn"]
        assert s.status == Status.COMPLETED and (st["turns"], st["tool_calls"], st["tool_errors"]) == (2, 1, 1)
        (msg,) = [m["content"] for m in st["messages"] if m["role"] == "tool"]
        assert msg.startswith("Error: the tool call could not be parsed (--tool-parser "
                              "'tests.test_security_parsers:recursive_parser' raised RecursionError")
        assert s.reward == 1.0
