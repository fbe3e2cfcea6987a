"""slime's rule-based rm-hub types: ``deepscaler``, ``dapo`` and ``gpqa`` (``--rm-type``), written for slick.

- ``deepscaler``: the answer is the last ``\\boxed{...}`` of the text after the reasoning (after the last
  ``</think>``, or after ``###Response``); a response with neither marker, or no box there, scores 0. The box is
  compared with the label by math equivalence (the ``math`` verifier). 1.0 or 0.0.
- ``dapo``: DAPO's integer answers: the last ``Answer: X`` line within the response's last 300 characters,
  normalised (spaces, ``$``, ``\\boxed{}``, ``\\text{}``, a trailing period and thousands separators removed),
  must equal the label read as an integer. 1.0 when it does, else -1.0 (as DAPO and slime score).
- ``gpqa``: multiple choice. The chosen letter is the one after "answer"/"option"/"choice" (optionally "is"/":"),
  else the last standalone capital letter among the valid ones (A-J, or as many as ``metadata["choices"]``),
  read after the last ``</think>``. The correct letter is ``metadata["correct_letter"]``, else the label when it is
  a letter, else the letter of the choice whose text equals the label. 1.0 or 0.0.

slime's ``ifbench`` needs allenai/IFBench's instruction checkers, which slime clones at run time; slick downloads
nothing, so it is refused by name (``REFUSED``).
"""
from __future__ import annotations

import re
import string
from typing import Any, Optional

from slick.reward import math as math_rm
from slick.reward.errors import LabelError, label_error
from slick.reward.evidence import Judgement
from slick.reward.extract import last_boxed

REFUSED = {"ifbench": "slime's ifbench clones allenai/IFBench's instruction checkers at run time and slick downloads "
                      "nothing: install IFBench yourself and score with --custom-rm-path pkg.mod:fn"}


def _after_reasoning(response: str) -> Optional[str]:
    if "</think>" in response:
        return response.rsplit("</think>", 1)[1]
    if "###Response" in response:
        return response.split("###Response", 1)[1]
    return None


def judge_deepscaler(response: str, label: Any, metadata: Optional[dict] = None) -> Judgement:
    if isinstance(label, bool) or not isinstance(label, (str, int, float)):
        raise label_error("deepscaler", "a string or a number", label)
    solution = _after_reasoning(response)
    box = last_boxed(solution) if solution is not None else None
    if box is None or str(label) == "":
        return Judgement.binary(False, box, reason="no </think> or ###Response" if solution is None else "no box")
    return math_rm.judge(f"\\boxed{{{box}}}", label, metadata)


def _normalise(answer: str) -> str:
    a = answer.strip()
    inner = last_boxed(a)
    a = inner if inner is not None else a
    a = re.sub(r"\\text\{([^}]*)\}", r"\1", a).replace("$", "").replace(" ", "")
    a = a.rstrip(".")
    return re.sub(r"(?<=\d),(?=\d{3}\b)", "", a)


def judge_dapo(response: str, label: Any, metadata: Optional[dict] = None) -> Judgement:
    try:
        gold = str(int(float(str(label).strip())))
    except (TypeError, ValueError):
        raise LabelError(f"dapo reward: label {str(label)[:80]!r} is not an integer (DAPO's answers are)") from None
    found = re.findall(r"(?i)Answer\s*:\s*([^\n]+)", response[-300:])
    pred = _normalise(found[-1]) if found else None
    ok = pred == gold
    return Judgement(1.0 if ok else -1.0, pred, ok, {"gold": gold})


_LETTER_PATTERNS = (r"(?:answer|option|choice)\s*(?:is|:)?\s*\(?([A-Z])\b",
                    r"\(?([A-Z])\)?\s*is\s*(?:the\s*)?correct",
                    r"final\s*(?:answer|option)\s*(?:is|:)?\s*\(?([A-Z])\b")


def _valid_letters(metadata: dict) -> list[str]:
    if metadata.get("valid_letters"):
        return [str(x).upper() for x in metadata["valid_letters"]]
    choices = metadata.get("choices")
    return list(string.ascii_uppercase[:len(choices)]) if choices else list(string.ascii_uppercase[:10])


def _gold_letter(label: Any, metadata: dict, valid: list[str]) -> str:
    if isinstance(metadata.get("correct_letter"), str):
        return metadata["correct_letter"].strip().upper()
    text = str(label).strip() if label is not None else ""
    if len(text.strip("()")) == 1 and text.strip("()").upper() in valid:
        return text.strip("()").upper()
    choices = metadata.get("choices")
    choices = list(choices.values()) if isinstance(choices, dict) else list(choices or [])
    for letter, choice in zip(valid, choices):
        if str(choice).strip().lower() == text.lower():
            return letter
    raise LabelError(f"gpqa reward: label {text[:80]!r} is neither a letter ({', '.join(valid)}) nor one of the "
                     f"choices (metadata['choices']), and metadata has no correct_letter")


def judge_gpqa(response: str, label: Any, metadata: Optional[dict] = None) -> Judgement:
    metadata = metadata or {}
    valid = _valid_letters(metadata)
    gold = _gold_letter(label, metadata, valid)
    text = (response or "").rsplit("</think>", 1)[-1]
    pred = None
    for pattern in _LETTER_PATTERNS:
        m = re.search(pattern, text, flags=re.IGNORECASE)
        if m and m.group(1).upper() in valid:
            pred = m.group(1).upper()
            break
    if pred is None:
        pred = next((x for x in reversed(re.findall(r"\b([A-Z])\b", text)) if x in valid), None)
    return Judgement.binary(pred == gold, pred, gold=gold)


def score_deepscaler(response: str, label: Any, metadata: Optional[dict] = None) -> float:
    return judge_deepscaler(response, label, metadata).score


def score_dapo(response: str, label: Any, metadata: Optional[dict] = None) -> float:
    return judge_dapo(response, label, metadata).score


def score_gpqa(response: str, label: Any, metadata: Optional[dict] = None) -> float:
    return judge_gpqa(response, label, metadata).score
