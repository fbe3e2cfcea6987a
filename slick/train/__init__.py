"""Training side: Trainer (packing, chunked logprobs, AdamW), run checkpoints, HF export, weight sync.

Import submodules directly (``from slick.train.trainer import Trainer``); this package imports nothing heavy.
"""
