"""Prompt datasets: read JSONL / Parquet prompt files into checked rows, then tokenize them.

A dataset *spec* is a path with an optional row slice: ``data.jsonl``, ``data.parquet@[100:]``,
``data.jsonl@[:-50]`` (Python slice semantics, either side optional). Every bad row raises
``DataError`` naming the file, the 1-based line (JSONL) or row (Parquet), and the key; text that is not
valid Unicode (a lone surrogate such as JSON ``"\\ud800"``) in the prompt, label, metadata or tools is
refused the same way, naming the field. Nothing is silently dropped, except prompts longer than
``max_prompt_len`` tokens, which are counted and logged. Whether prompts fit the model's context is checked
when a run starts (slick/data/checks.py).
"""
from __future__ import annotations

import json
import logging
import re
from pathlib import Path
from typing import Any, Optional

from slick.config import Config
from slick.config.groups import DataConfig
from slick.data import environments as env_specs
from slick.data import reasoning_gym as rg_data

logger = logging.getLogger(__name__)

_SLICE_RE = re.compile(r"^(?P<path>.*)@\[(?P<start>[+-]?\d*):(?P<end>[+-]?\d*)\]$")


class DataError(ValueError):
    """A problem with a prompt file; the message names the file, line/row and key."""


_SURROGATE = re.compile("[\ud800-\udfff]")


def _bad_text(value: Any, at: str) -> Optional[tuple[str, str, int]]:
    """(where in ``value``, the string, index) of the first string holding a lone surrogate (JSON text like
    ``"\\ud800"`` decodes to one; it is not Unicode text and cannot be encoded), else None."""
    if isinstance(value, str):
        if value.isascii():                     # O(1) in CPython, and the common case
            return None
        m = _SURROGATE.search(value)
        return None if m is None else (at, value, m.start())
    if isinstance(value, dict):
        items = value.items()
    elif isinstance(value, list):
        items = enumerate(value)
    else:
        return None
    for k, v in items:
        if isinstance(k, str) and not k.isascii() and _SURROGATE.search(k):
            return f"{at} (a key)", k, _SURROGATE.search(k).start()
        found = _bad_text(v, f"{at}[{k!r}]" if isinstance(k, str) else f"{at}[{k}]")
        if found:
            return found
    return None


def _check_text(value: Any, where: str, key: str) -> None:
    """Refuse a value of the row's ``key`` that holds a lone surrogate, naming the field and character."""
    found = None if value is None or isinstance(value, (int, float)) else _bad_text(value, key)
    if found:
        field, text, i = found
        raise DataError(f"{where}: field {field} holds a lone surrogate {text[i]!r} at character {i} (a \\uD800-"
                        f"\\uDFFF escape without its pair): not valid Unicode text; fix or remove this row")


def parse_spec(spec: str) -> tuple[str, slice]:
    """Split ``path@[start:end]`` into (path, slice). A spec without ``@[...]`` selects every row."""
    spec = str(spec)
    m = _SLICE_RE.match(spec)
    if m is None:
        if "@[" in spec:
            raise DataError(f"{spec}: bad row slice, expected path@[start:end] with integer bounds")
        return spec, slice(None)
    start, end = m.group("start"), m.group("end")
    return m.group("path"), slice(int(start) if start else None, int(end) if end else None)


def _read_jsonl(path: Path) -> list[tuple[int, Any]]:
    """Return [(line_number, parsed_value)] for every non-blank line."""
    out = []
    with open(path, "rb") as fh:
        for lineno, raw in enumerate(fh, start=1):
            try:
                text = raw.decode("utf-8")
            except UnicodeDecodeError as e:
                raise DataError(f"{path}:{lineno}: file is not valid UTF-8 (byte {e.start} of the line)") from None
            if lineno == 1 and text.startswith("\ufeff"):
                text = text[1:]  # tolerate a UTF-8 byte-order mark
            if not text.strip():
                continue
            try:
                out.append((lineno, json.loads(text)))
            except json.JSONDecodeError as e:
                raise DataError(f"{path}:{lineno}: malformed JSON ({e.msg} at column {e.colno})") from None
    return out


def _read_parquet(path: Path) -> list[tuple[int, Any]]:
    """Return [(row_number, row_dict)] with 1-based row numbers."""
    import pyarrow.parquet as pq

    try:
        table = pq.read_table(path)
    except Exception as e:  # pyarrow raises several types for corrupt files
        raise DataError(f"{path}: cannot read Parquet file ({e})") from None
    return [(i + 1, row) for i, row in enumerate(table.to_pylist())]


def _maybe_json(value: Any, where: str, what: str) -> Any:
    """Parquet columns often hold JSON text for nested values; decode strings that look like JSON."""
    if isinstance(value, str) and value.strip()[:1] in ("{", "["):
        try:
            return json.loads(value)
        except json.JSONDecodeError:
            raise DataError(f"{where}: key '{what}' holds a string that is not valid JSON") from None
    return value


def _check_prompt(prompt: Any, where: str, key: str) -> Any:
    if isinstance(prompt, str):
        if not prompt.strip():
            raise DataError(f"{where}: key '{key}' is an empty prompt")
        return prompt
    if isinstance(prompt, list):
        if not prompt:
            raise DataError(f"{where}: key '{key}' is an empty message list")
        for j, msg in enumerate(prompt):
            if not isinstance(msg, dict):
                raise DataError(f"{where}: key '{key}' message {j} is not an object with role/content")
            if not isinstance(msg.get("role"), str) or not msg["role"]:
                raise DataError(f"{where}: key '{key}' message {j} has no 'role'")
            content = msg.get("content")
            if (content is None or content == "" or content == []) and not msg.get("tool_calls"):
                raise DataError(f"{where}: key '{key}' message {j} ({msg['role']}) has no content")
        return prompt
    raise DataError(f"{where}: key '{key}' must be a string or a list of chat messages, "
                    f"got {type(prompt).__name__}")


def load_prompt_rows(spec: str, input_key: str = "prompt", label_key: Optional[str] = "label",
                     metadata_key: Optional[str] = "metadata", tool_key: Optional[str] = None) -> list[dict]:
    """Read and check the rows selected by ``spec``.

    Returns dicts ``{"prompt_index", "prompt", "label", "metadata", "tools"}`` where
    ``prompt_index`` is the 0-based row number in the file (blank JSONL lines are not rows).
    A missing label is ``None``; a missing metadata is ``{}``; metadata and tools given as JSON
    text (common in Parquet) are decoded. Raises ``DataError`` on any problem, a lone surrogate
    (JSON ``"\\ud800"``) in any of these fields included.
    """
    return _load_rows(spec, input_key, label_key, metadata_key, tool_key)[0]


def _load_rows(spec: str, input_key: str, label_key: Optional[str], metadata_key: Optional[str],
               tool_key: Optional[str]) -> tuple[list[dict], list[str]]:
    """:func:`load_prompt_rows` and, per row, where it is (``path:line`` or ``path row N``)."""
    path_str, sl = parse_spec(spec)
    if rg_data.is_spec(path_str) or env_specs.is_spec(path_str):   # generated: reasoning-gym / an environment
        try:
            rows, wheres = (rg_data if rg_data.is_spec(path_str) else env_specs).load_rows(path_str)
        except ValueError as e:      # a bad spec, reasoning-gym missing, a generator that failed
            raise DataError(str(e)) from None
        rows, wheres = rows[sl], wheres[sl]
        if not rows:
            raise DataError(f"{spec}: empty dataset after the row slice")
        return rows, wheres
    path = Path(path_str)
    if not path.exists():
        raise DataError(f"{path}: prompt file not found")
    if not path.is_file():
        raise DataError(f"{path}: not a file")
    suffix = path.suffix.lower()
    if suffix in (".jsonl", ".ndjson"):
        raw, unit = _read_jsonl(path), "line"
    elif suffix in (".parquet", ".pq"):
        raw, unit = _read_parquet(path), "row"
    else:
        raise DataError(f"{path}: unsupported extension '{path.suffix}' (use .jsonl or .parquet)")

    selected = list(enumerate(raw))[sl]
    if not selected:
        extra = f" after slice [{spec.rsplit('@[', 1)[-1]}" if sl != slice(None) else ""
        raise DataError(f"{path}: empty dataset ({len(raw)} rows{extra})")

    rows, wheres = [], []
    for prompt_index, (num, obj) in selected:
        where = f"{path}:{num}" if unit == "line" else f"{path} row {num}"
        if not isinstance(obj, dict):
            raise DataError(f"{where}: expected a JSON object, got {type(obj).__name__}")
        if input_key not in obj:
            raise DataError(f"{where}: missing input key '{input_key}' (keys: {sorted(obj)})")
        prompt = _check_prompt(obj[input_key], where, input_key)
        label = obj.get(label_key) if label_key else None
        metadata = obj.get(metadata_key) if metadata_key else None
        metadata = {} if metadata is None else _maybe_json(metadata, where, metadata_key)
        if not isinstance(metadata, dict):
            raise DataError(f"{where}: key '{metadata_key}' must be an object (dict), got {type(metadata).__name__}")
        tools = None
        if tool_key:
            tools = _maybe_json(obj.get(tool_key), where, tool_key)
            if tools is not None and not isinstance(tools, list):
                raise DataError(f"{where}: key '{tool_key}' must be a list of tools, got {type(tools).__name__}")
        for key, value in ((input_key, prompt), (label_key, label), (metadata_key, metadata), (tool_key, tools)):
            _check_text(value, where, key)
        rows.append({"prompt_index": prompt_index, "prompt": prompt, "label": label,
                     "metadata": metadata, "tools": tools})
        wheres.append(where)
    return rows, wheres


class PromptDataset:
    """Checked, tokenized prompts. ``ds[i]`` is a row dict plus ``prompt_ids`` and ``text``.

    With ``apply_chat_template`` every prompt is rendered with the tokenizer's chat template
    (a string becomes one user message; ``tools`` are passed through) and a generation prompt
    is appended; the rendered text is then encoded without adding special tokens. Without it a
    string prompt is encoded as is and a message list is an error. Prompts longer than
    ``max_prompt_len`` tokens are dropped; ``num_dropped`` says how many.
    """

    def __init__(self, spec: str, tokenizer, *, input_key: str = "prompt", label_key: Optional[str] = "label",
                 metadata_key: Optional[str] = "metadata", tool_key: Optional[str] = None,
                 apply_chat_template: bool = False, max_prompt_len: Optional[int] = None):
        self.spec = spec
        self.path, _ = parse_spec(spec)
        rows, wheres = _load_rows(spec, input_key, label_key, metadata_key, tool_key)
        texts = [self._render(r, tokenizer, apply_chat_template, input_key) for r in rows]
        ids = _encode(tokenizer, texts)
        self.rows: list[dict] = []
        self.where: list[str] = []     # per kept row: its file and line (JSONL) or row (Parquet), for messages
        self.num_dropped = 0
        for row, where, text, prompt_ids in zip(rows, wheres, texts, ids):
            if max_prompt_len is not None and len(prompt_ids) > max_prompt_len:
                self.num_dropped += 1
                continue
            row["text"], row["prompt_ids"] = text, list(prompt_ids)
            self.rows.append(row)
            self.where.append(where)
        if self.num_dropped:
            logger.warning("%s: dropped %d of %d prompts longer than %d tokens (--rollout-max-prompt-len)",
                           self.path, self.num_dropped, len(rows), max_prompt_len)
        if not self.rows:
            raise DataError(f"{self.path}: empty dataset: all {len(rows)} prompts are longer than "
                            f"{max_prompt_len} tokens (--rollout-max-prompt-len)")

    @classmethod
    def from_config(cls, cfg: DataConfig | Config, tokenizer, spec: Optional[str] = None) -> "PromptDataset":
        """Build from the data group (``slick.config.groups.DataConfig``, or a ``Config``); ``spec`` defaults to
        ``--prompt-data``."""
        spec = spec if spec is not None else cfg.prompt_data
        if not spec:
            raise DataError("no prompt data given (--prompt-data)")
        return cls(spec, tokenizer, input_key=cfg.input_key, label_key=cfg.label_key,
                   metadata_key=cfg.metadata_key, tool_key=cfg.tool_key,
                   apply_chat_template=cfg.apply_chat_template, max_prompt_len=cfg.rollout_max_prompt_len)

    def _render(self, row: dict, tokenizer, apply_chat_template: bool, input_key: str) -> str:
        prompt = row["prompt"]
        if not apply_chat_template:
            if isinstance(prompt, list):
                raise DataError(f"{self.path} row {row['prompt_index'] + 1}: key '{input_key}' is a list of chat "
                                "messages; pass --apply-chat-template to render it")
            return prompt
        messages = [{"role": "user", "content": prompt}] if isinstance(prompt, str) else prompt
        try:
            return tokenizer.apply_chat_template(messages, tools=row["tools"], add_generation_prompt=True,
                                                 tokenize=False)
        except Exception as e:
            raise DataError(f"{self.path} row {row['prompt_index'] + 1}: chat template failed: {e}") from e

    def __len__(self) -> int:
        return len(self.rows)

    def __getitem__(self, i: int) -> dict:
        return self.rows[i]

    def __iter__(self):
        return iter(self.rows)


def _encode(tokenizer, texts: list[str], chunk: int = 1024) -> list[list[int]]:
    out: list[list[int]] = []
    for i in range(0, len(texts), chunk):
        out.extend(tokenizer(texts[i:i + chunk], add_special_tokens=False)["input_ids"])
    return out
