"""slime's ``mask_utils`` for plug-ins that build SFT or multi-turn samples themselves:
``MultiTurnLossMaskGenerator(tokenizer, tokenizer_type).get_loss_mask(messages, tools) -> (token_ids, loss_mask)``,
``get_text_from_loss_mask`` (the decoded runs of mask-1 tokens) and ``get_response_lengths`` (from each mask's
first 1 to its end).

slime writes one generator per model family (``qwen``, ``qwen3``, ``qwen3_5``, ``distill_qwen``); here every type
reads the tokenizer's own chat template, so any model works: the tokens are the rendered conversation, and an
assistant message's tokens (after the template's assistant header, up to and including its end-of-turn markup)
have mask 1 unless the message carries ``step_loss_mask`` other than 1. A template that rewrites earlier turns
when a later one is added (``slick check-template`` finds them) cannot be masked this way and raises
``ValueError``. Needs a fast tokenizer (character offsets).
"""
from __future__ import annotations

from typing import Optional

TYPES = ("qwen", "qwen3", "qwen3_5", "distill_qwen")


def get_response_lengths(loss_masks: list[list[int]]) -> list[int]:
    return [len(m) - m.index(1) if 1 in m else 0 for m in loss_masks]


class MultiTurnLossMaskGenerator:
    def __init__(self, tokenizer, tokenizer_type: str = "qwen"):
        if tokenizer_type not in TYPES:
            raise ValueError(f"Unsupported tokenizer type: {tokenizer_type}")
        self.tokenizer, self.tokenizer_type = tokenizer, tokenizer_type

    def get_response_lengths(self, loss_masks: list[list[int]]) -> list[int]:
        return get_response_lengths(loss_masks)

    def find_all_sublist_indices(self, main_list: list, sublist: list) -> list[int]:
        n = len(sublist)
        return [i for i in range(len(main_list) - n + 1) if main_list[i:i + n] == sublist]

    def _render(self, messages: list[dict], tools: Optional[list], generation: bool) -> str:
        kw = {"tools": tools} if tools else {}
        return self.tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=generation, **kw)

    def get_loss_mask(self, messages: list[dict], tools: Optional[list] = None) -> tuple[list[int], list[int]]:
        full = self._render(messages, tools, False)
        spans = []
        for i, m in enumerate(messages):
            if m.get("role") != "assistant":
                continue
            start, end = self._render(messages[:i], tools, True), self._render(messages[:i + 1], tools, False)
            if not (full.startswith(end) and end.startswith(start)):
                raise ValueError(f"the chat template rewrites the conversation before assistant message {i} when "
                                 f"later turns are added, so its tokens cannot be masked from the template")
            if m.get("step_loss_mask", 1) == 1:
                spans.append((len(start), len(end)))
        enc = self.tokenizer(full, add_special_tokens=False, return_offsets_mapping=True)
        mask = [int(any(a <= lo and hi <= b for a, b in spans)) if hi > lo else 0 for lo, hi in enc["offset_mapping"]]
        return list(enc["input_ids"]), mask

    gen_multi_turn_loss_mask_qwen = get_loss_mask
    gen_multi_turn_loss_mask_qwen3 = get_loss_mask
    gen_multi_turn_loss_mask_qwen3_5 = get_loss_mask
    gen_multi_turn_loss_mask_distill_qwen = get_loss_mask

    def get_text_from_loss_mask(self, token_ids: list[int], loss_masks: list[int]) -> list[str]:
        texts, run = [], []
        for tid, m in zip(token_ids, loss_masks):
            if m == 1:
                run.append(tid)
            elif run:
                texts.append(self.tokenizer.decode(run))
                run = []
        if run:
            texts.append(self.tokenizer.decode(run))
        return texts
