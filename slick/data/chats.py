"""Chat datasets for supervised fine-tuning: JSONL / Parquet rows -> checked, tokenized chats with loss masks.

A row is one of:

* a chat: ``{"messages": [{"role": "system"|"user"|"assistant"|"tool", "content": ...}, ...]}`` (the key is
  --input-key; assistant messages may carry OpenAI-style ``tool_calls``; ``tools`` under --tool-key go to the
  chat template). Every assistant message is trained; the rest is context (``slick.chat.turns``).
* a prompt/completion pair: ``{"prompt": "...", "completion": "..."}`` (--input-key and --completion-key; either
  side a string or a list of messages). With --apply-chat-template (or when either side is a message list) the
  pair is the chat [user prompt, assistant completion]; otherwise the prompt text is encoded as is and the
  completion text followed by the EOS token is trained.

Every row is checked and tokenized when the dataset is built, before any model loads or step runs; a bad row
raises ``DataError`` naming the file, the line (JSONL) or row (Parquet) and what is wrong. A chat longer than
``max_len`` tokens (the model's context) is refused the same way, never cut.
"""
from __future__ import annotations

from pathlib import Path
from typing import Optional

from slick.chat.delta import ChatTemplateRewriteError
from slick.chat.turns import chat_tokens
from slick.config import Config, ConfigView
from slick.data.dataset import (DataError, _check_prompt, _check_text, _maybe_json, _read_jsonl, _read_parquet,
                                parse_spec)


def _read(spec: str) -> list[tuple[str, dict, int]]:
    """(where, row, 0-based row index) for the rows ``spec`` selects; DataError for a missing file or no rows."""
    path_str, sl = parse_spec(spec)
    path = Path(path_str)
    if not path.is_file():
        raise DataError(f"{path}: chat file not found" if not path.exists() else f"{path}: not a file")
    suffix = path.suffix.lower()
    if suffix in (".jsonl", ".ndjson"):
        raw, unit = _read_jsonl(path), "line"
    elif suffix in (".parquet", ".pq"):
        raw, unit = _read_parquet(path), "row"
    else:
        raise DataError(f"{path}: unsupported extension '{path.suffix}' (use .jsonl or .parquet)")
    selected = list(enumerate(raw))[sl]
    if not selected:
        raise DataError(f"{path}: empty dataset ({len(raw)} rows before the slice)")
    out = []
    for index, (num, obj) in selected:
        where = f"{path}:{num}" if unit == "line" else f"{path} row {num}"
        if not isinstance(obj, dict):
            raise DataError(f"{where}: expected a JSON object, got {type(obj).__name__}")
        out.append((where, obj, index))
    return out


def _messages(value, where: str, key: str, role: str) -> list[dict]:
    """A side of a pair as messages: a string becomes one message of ``role``."""
    value = _check_prompt(_maybe_json(value, where, key), where, key)
    return [{"role": role, "content": value}] if isinstance(value, str) else list(value)


class ChatDataset:
    """Checked, tokenized chats. ``ds[i]`` is a row dict with ``prompt`` (the messages or prompt text),
    ``prompt_ids``, ``response_ids``, ``loss_mask``, ``prompt_index`` and ``tools``; ``where[i]`` names its
    file and line. Rows are the shape ``slick.data.source.DataSource`` hands out."""

    def __init__(self, spec: str, tokenizer, *, input_key: str = "messages", completion_key: str = "completion",
                 tool_key: Optional[str] = "tools", apply_chat_template: bool = False,
                 max_len: Optional[int] = None, max_len_source: str = "the model's context"):
        self.spec = spec
        self.path, _ = parse_spec(spec)
        self.rows: list[dict] = []
        self.where: list[str] = []
        for where, obj, index in _read(spec):
            row = self._row(obj, where, tokenizer, input_key, completion_key, tool_key, apply_chat_template)
            n = len(row["prompt_ids"]) + len(row["response_ids"])
            if max_len is not None and n > max_len:
                raise DataError(f"{where}: the chat is {n} tokens long, more than the {max_len} of {max_len_source}; "
                                "shorten or split it (SFT never cuts a chat)")
            row["prompt_index"] = index
            self.rows.append(row)
            self.where.append(where)
        self.row_at = {r["prompt_index"]: r for r in self.rows}

    @classmethod
    def from_config(cls, cfg: Config | ConfigView, tokenizer, spec: Optional[str] = None, max_len: Optional[int] = None,
                    max_len_source: str = "the model's context") -> "ChatDataset":
        """Build from a ``Config`` or a view with its data and sft_distill groups (``spec`` defaults to
        --prompt-data)."""
        cfg = cfg.view("data", "sft_distill")
        spec = spec if spec is not None else cfg.prompt_data
        if not spec:
            raise DataError("no chat data given (--prompt-data)")
        return cls(spec, tokenizer, input_key=cfg.input_key, completion_key=cfg.completion_key,
                   tool_key=cfg.tool_key, apply_chat_template=cfg.apply_chat_template, max_len=max_len,
                   max_len_source=max_len_source)

    def _row(self, obj: dict, where: str, tok, input_key: str, completion_key: str, tool_key: Optional[str],
             chat: bool) -> dict:
        if input_key not in obj:
            raise DataError(f"{where}: missing input key '{input_key}' (keys: {sorted(obj)})")
        tools = _maybe_json(obj.get(tool_key), where, tool_key) if tool_key else None
        if tools is not None and not isinstance(tools, list):
            raise DataError(f"{where}: key '{tool_key}' must be a list of tools, got {type(tools).__name__}")
        prompt = _maybe_json(obj[input_key], where, input_key)
        _check_text(prompt, where, input_key)
        if completion_key in obj:
            completion = _maybe_json(obj[completion_key], where, completion_key)
            _check_text(completion, where, completion_key)
            if not chat and isinstance(prompt, str) and isinstance(completion, str):
                return self._text_pair(prompt, completion, where, tok, input_key, completion_key)
            messages = (_messages(prompt, where, input_key, "user")
                        + _messages(completion, where, completion_key, "assistant"))
        else:
            if not isinstance(prompt, list):
                raise DataError(f"{where}: key '{input_key}' must be a list of chat messages (or give the row a "
                                f"'{completion_key}' to make it a prompt/completion pair), got {type(prompt).__name__}")
            messages = _check_prompt(prompt, where, input_key)
        try:
            t = chat_tokens(tok, messages, tools)
        except ChatTemplateRewriteError as e:
            raise DataError(f"{where}: {e}") from None
        except Exception as e:   # noqa: BLE001 - a template that raises, a bad tool call: name the row
            raise DataError(f"{where}: key '{input_key}': {e}") from None
        return {"prompt": messages, "prompt_ids": t.prompt_ids, "response_ids": t.response_ids,
                "loss_mask": t.loss_mask, "tools": tools, "label": None, "metadata": {}}

    @staticmethod
    def _text_pair(prompt: str, completion: str, where: str, tok, input_key: str, completion_key: str) -> dict:
        for key, text in ((input_key, prompt), (completion_key, completion)):
            if not text.strip():
                raise DataError(f"{where}: key '{key}' is empty")
        prompt_ids = list(tok(prompt, add_special_tokens=False)["input_ids"])   # as PromptDataset encodes it
        response_ids = list(tok(completion, add_special_tokens=False)["input_ids"])
        if tok.eos_token_id is not None:
            response_ids.append(int(tok.eos_token_id))
        return {"prompt": prompt, "prompt_ids": prompt_ids, "response_ids": response_ids,
                "loss_mask": [1] * len(response_ids), "tools": None, "label": None, "metadata": {}}

    def __len__(self) -> int:
        return len(self.rows)

    def __getitem__(self, i: int) -> dict:
        return self.rows[i]

    def __iter__(self):
        return iter(self.rows)

    def num_trained_tokens(self) -> int:
        return sum(sum(r["loss_mask"]) for r in self.rows)
