"""Prompt files: reading, slicing, error messages, tokenization and length filtering."""
import json

import pytest

from slick.data import DataError, PromptDataset, load_prompt_rows, parse_spec


@pytest.fixture(scope="module")
def tok(smollm2_dir):
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(smollm2_dir)


def write_jsonl(path, rows, raw_lines=None):
    lines = [json.dumps(r) for r in rows] if raw_lines is None else raw_lines
    path.write_text("\n".join(lines) + "\n", encoding="utf-8")
    return path


def rows10(tmp_path):
    return write_jsonl(tmp_path / "p.jsonl", [{"prompt": f"q{i}", "label": str(i), "metadata": {"i": i}}
                                              for i in range(10)])


# -- parsing ------------------------------------------------------------------------------------
def test_parse_spec():
    assert parse_spec("a/b.jsonl") == ("a/b.jsonl", slice(None))
    assert parse_spec("a/b.jsonl@[2:5]") == ("a/b.jsonl", slice(2, 5))
    assert parse_spec("x.parquet@[:-3]") == ("x.parquet", slice(None, -3))
    assert parse_spec("x.parquet@[4:]") == ("x.parquet", slice(4, None))
    with pytest.raises(DataError, match="bad row slice"):
        parse_spec("x.jsonl@[a:b]")


def test_jsonl_rows_and_slices(tmp_path):
    p = rows10(tmp_path)
    rows = load_prompt_rows(str(p))
    assert [r["prompt_index"] for r in rows] == list(range(10))
    assert rows[3] == {"prompt_index": 3, "prompt": "q3", "label": "3", "metadata": {"i": 3}, "tools": None}
    assert [r["prompt"] for r in load_prompt_rows(f"{p}@[2:5]")] == ["q2", "q3", "q4"]
    assert [r["prompt_index"] for r in load_prompt_rows(f"{p}@[:-8]")] == [0, 1]
    assert [r["prompt_index"] for r in load_prompt_rows(f"{p}@[7:]")] == [7, 8, 9]


def test_blank_lines_are_not_rows(tmp_path):
    p = write_jsonl(tmp_path / "b.jsonl", None, ['{"prompt": "a"}', "", "   ", '{"prompt": "b"}'])
    rows = load_prompt_rows(str(p))
    assert [(r["prompt_index"], r["prompt"]) for r in rows] == [(0, "a"), (1, "b")]
    assert rows[0]["label"] is None and rows[0]["metadata"] == {}


def test_custom_keys_and_tools(tmp_path):
    tools = [{"type": "function", "function": {"name": "calc"}}]
    p = write_jsonl(tmp_path / "k.jsonl", [{"question": "hi", "answer": 7, "info": {"rm_type": "exact"},
                                           "fns": tools}])
    (r,) = load_prompt_rows(str(p), input_key="question", label_key="answer", metadata_key="info", tool_key="fns")
    assert r["prompt"] == "hi" and r["label"] == 7 and r["metadata"] == {"rm_type": "exact"} and r["tools"] == tools


def test_parquet(tmp_path):
    import pyarrow as pa
    import pyarrow.parquet as pq

    msgs = [[{"role": "user", "content": f"m{i}"}] for i in range(4)]
    table = pa.table({"prompt": msgs, "label": ["0", "1", "2", "3"],
                      "metadata": [json.dumps({"k": i}) for i in range(4)]})
    p = tmp_path / "d.parquet"
    pq.write_table(table, p)
    rows = load_prompt_rows(f"{p}@[1:3]")
    assert [r["prompt_index"] for r in rows] == [1, 2]
    assert rows[0]["prompt"] == [{"role": "user", "content": "m1"}]
    assert rows[1]["metadata"] == {"k": 2}  # JSON text metadata is decoded

    bad = tmp_path / "bad.parquet"
    pq.write_table(pa.table({"prompt": ["a", ""]}), bad)
    with pytest.raises(DataError, match=r"bad\.parquet row 2: key 'prompt' is an empty prompt"):
        load_prompt_rows(str(bad))


# -- errors -------------------------------------------------------------------------------------
@pytest.mark.parametrize("lines,kwargs,pattern", [
    (['{"prompt": "a"}', '{"prompt": "b"'], {}, r"e\.jsonl:2: malformed JSON"),
    (['{"prompt": "a"}', "", '{"text": "b"}'], {}, r"e\.jsonl:3: missing input key 'prompt'"),
    (['{"prompt": ""}'], {}, r"e\.jsonl:1: key 'prompt' is an empty prompt"),
    (['{"prompt": "  \\n"}'], {}, r"e\.jsonl:1: key 'prompt' is an empty prompt"),
    (['{"prompt": []}'], {}, r"e\.jsonl:1: key 'prompt' is an empty message list"),
    (['{"prompt": [{"role": "user"}]}'], {}, r"e\.jsonl:1: key 'prompt' message 0 \(user\) has no content"),
    (['{"prompt": [{"role": "user", "content": ""}]}'], {}, r"message 0 \(user\) has no content"),
    (['{"prompt": [{"content": "x"}]}'], {}, r"e\.jsonl:1: key 'prompt' message 0 has no 'role'"),
    (['{"prompt": 5}'], {}, r"e\.jsonl:1: key 'prompt' must be a string or a list"),
    (['[1, 2]'], {}, r"e\.jsonl:1: expected a JSON object"),
    (['{"prompt": "a"}', '{"prompt": "b", "metadata": [1]}'], {}, r"e\.jsonl:2: key 'metadata' must be an object"),
    (['{"prompt": "a", "meta": 3}'], {"metadata_key": "meta"}, r"e\.jsonl:1: key 'meta' must be an object"),
    (['{"prompt": "a", "tools": {"x": 1}}'], {"tool_key": "tools"}, r"e\.jsonl:1: key 'tools' must be a list"),
])
def test_row_errors_name_file_line_key(tmp_path, lines, kwargs, pattern):
    p = write_jsonl(tmp_path / "e.jsonl", None, lines)
    with pytest.raises(DataError, match=pattern):
        load_prompt_rows(str(p), **kwargs)


def test_file_errors(tmp_path):
    with pytest.raises(DataError, match=r"nope\.jsonl: prompt file not found"):
        load_prompt_rows(str(tmp_path / "nope.jsonl"))
    (tmp_path / "x.csv").write_text("prompt\na\n")
    with pytest.raises(DataError, match=r"x\.csv: unsupported extension '\.csv'"):
        load_prompt_rows(str(tmp_path / "x.csv"))
    latin = tmp_path / "latin.jsonl"
    latin.write_bytes(b'{"prompt": "ok"}\n{"prompt": "caf\xe9"}\n')
    with pytest.raises(DataError, match=r"latin\.jsonl:2: file is not valid UTF-8"):
        load_prompt_rows(str(latin))
    empty = tmp_path / "empty.jsonl"
    empty.write_text("\n\n")
    with pytest.raises(DataError, match=r"empty\.jsonl: empty dataset \(0 rows"):
        load_prompt_rows(str(empty))
    p = rows10(tmp_path)
    with pytest.raises(DataError, match=r"p\.jsonl: empty dataset \(10 rows after slice \[20:\]"):
        load_prompt_rows(f"{p}@[20:]")


def test_errors_outside_slice_still_need_valid_json(tmp_path):
    # a slice skips rows but every line must still parse (row numbering depends on it)
    p = write_jsonl(tmp_path / "s.jsonl", None, ['{"prompt": "a"}', '{"text": "no prompt key"}', "{broken"])
    with pytest.raises(DataError, match=r"s\.jsonl:3: malformed JSON"):
        load_prompt_rows(f"{p}@[:1]")
    p2 = write_jsonl(tmp_path / "s2.jsonl", None, ['{"prompt": "a"}', '{"text": "no prompt key"}'])
    assert [r["prompt"] for r in load_prompt_rows(f"{p2}@[:1]")] == ["a"]


# -- tokenization -------------------------------------------------------------------------------
def test_dataset_plain_strings(tmp_path, tok):
    p = rows10(tmp_path)
    ds = PromptDataset(str(p), tok)
    assert len(ds) == 10 and ds.num_dropped == 0
    assert ds[4]["text"] == "q4"
    assert ds[4]["prompt_ids"] == tok("q4", add_special_tokens=False)["input_ids"]
    assert ds[4]["label"] == "4" and ds[4]["prompt_index"] == 4


def test_dataset_chat_template(tmp_path, tok):
    p = write_jsonl(tmp_path / "c.jsonl", [{"prompt": "What is 2+2?"},
                                           {"prompt": [{"role": "system", "content": "Be brief."},
                                                       {"role": "user", "content": "Hi"}]}])
    ds = PromptDataset(str(p), tok, apply_chat_template=True)
    want0 = tok.apply_chat_template([{"role": "user", "content": "What is 2+2?"}], add_generation_prompt=True,
                                    tokenize=False)
    assert ds[0]["text"] == want0
    assert ds[0]["text"].endswith("<|im_start|>assistant\n") and "What is 2+2?" in ds[0]["text"]
    assert ds[0]["prompt_ids"] == tok(want0, add_special_tokens=False)["input_ids"]
    assert ds[1]["text"].startswith("<|im_start|>system\nBe brief.<|im_end|>")
    assert ds[1]["prompt_ids"][0] == tok.convert_tokens_to_ids("<|im_start|>")


def test_messages_without_chat_template_flag_is_an_error(tmp_path, tok):
    p = write_jsonl(tmp_path / "m.jsonl", [{"prompt": "ok"}, {"prompt": [{"role": "user", "content": "x"}]}])
    with pytest.raises(DataError, match=r"m\.jsonl row 2: key 'prompt' is a list of chat messages; "
                                        r"pass --apply-chat-template"):
        PromptDataset(str(p), tok)


def test_tools_reach_the_chat_template(tmp_path, tok):
    import copy

    t = copy.deepcopy(tok)
    t.chat_template = ("{% if tools %}TOOLS:{% for x in tools %}{{ x.function.name }};{% endfor %}|{% endif %}"
                       "{% for m in messages %}{{ m.role }}: {{ m.content }}|{% endfor %}"
                       "{% if add_generation_prompt %}assistant:{% endif %}")
    tools = [{"type": "function", "function": {"name": "calculator"}}]
    p = write_jsonl(tmp_path / "t.jsonl", [{"prompt": "hi", "tools": tools}, {"prompt": "yo"}])
    ds = PromptDataset(str(p), t, tool_key="tools", apply_chat_template=True)
    assert ds[0]["text"] == "TOOLS:calculator;|user: hi|assistant:"
    assert ds[1]["text"] == "user: yo|assistant:"


def test_max_prompt_len_drops_and_counts(tmp_path, tok, caplog):
    prompts = ["a", "one two three four five six seven eight nine ten", "b c", "x " * 40]
    p = write_jsonl(tmp_path / "l.jsonl", [{"prompt": s} for s in prompts])
    lens = [len(tok(s, add_special_tokens=False)["input_ids"]) for s in prompts]
    limit = 5
    assert sorted(lens)[1] <= limit < sorted(lens)[2]  # the data really straddles the limit
    with caplog.at_level("WARNING"):
        ds = PromptDataset(str(p), tok, max_prompt_len=limit)
    kept = [i for i, n in enumerate(lens) if n <= limit]
    assert [r["prompt_index"] for r in ds] == kept
    assert ds.num_dropped == len(prompts) - len(kept) == 2
    assert "dropped 2 of 4 prompts longer than 5 tokens" in caplog.text
    with pytest.raises(DataError, match="all 4 prompts are longer than 0 tokens"):
        PromptDataset(str(p), tok, max_prompt_len=0)


def test_from_config(tmp_path, tok):
    from slick.config import Config

    p = rows10(tmp_path)
    cfg = Config.from_flat({"prompt_data": f"{p}@[0:3]", "rollout_max_prompt_len": 100})
    ds = PromptDataset.from_config(cfg, tok)
    assert [r["prompt"] for r in ds] == ["q0", "q1", "q2"]
    ds2 = PromptDataset.from_config(cfg, tok, spec=f"{p}@[9:]")
    assert [r["prompt"] for r in ds2] == ["q9"]
