"""`slick sft`: supervised fine-tuning on chats, through the same loop as `slick train` and no engine.

``slick sft ARGS`` is ``slick train --loss-type sft_loss ARGS`` with SFT's defaults: one sample per chat
(--n-samples-per-prompt 1), chats under ``messages`` (--input-key), and no engine memory to release. Every
`slick train` flag keeps its meaning (batch sizes, --num-epoch, --lr and its schedule, --save, --save-hf,
--eval-prompt-data with held-out chats, Ray ranks); flags that cannot apply to SFT are refused by name.
"""
from __future__ import annotations

from slick.loop import sync

SFT_DEFAULTS = {"loss_type": "sft_loss", "input_key": "messages"}   # and what sft_loss implies (config/sft_distill.py)


def main(argv=None) -> int:
    return sync.main(argv, prog="slick sft", defaults=SFT_DEFAULTS)
