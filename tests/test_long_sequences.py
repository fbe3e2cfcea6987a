"""Long responses cost linear memory in the trainer: no tensor grows with a length squared.

Every tensor an op makes during a training forward and backward of one long sample (one packed row, the way
the trainer gets a sample longer than its micro-batch budget) is recorded with a dispatch mode; the largest one
at 4,096 tokens is at most ~2x the largest at 2,048 (an N x N tensor would be 4x), and below a stated bound.
"""
import random

import pytest
import torch
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_flatten

from slick.train.attention import BLOCK_ROWS, LONG_ROWS
from slick.train.logprobs import WGRAD_ROWS
from slick.train.packing import pack
from slick.train.trainer import Trainer
from slick.types import Sample
from tests.test_train import make_cfg


class LargestTensor(TorchDispatchMode):
    """The largest op output (elements) and the op that made it, apart from those with a vocabulary-sized
    dimension (the lm head's chunks, bounded by their rows: ``vocab_numel``)."""

    def __init__(self, vocab: int):
        super().__init__()
        self.vocab, self.numel, self.op, self.vocab_numel = vocab, 0, None, 0

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        for t in tree_flatten(out)[0]:
            if not isinstance(t, torch.Tensor):
                continue
            if self.vocab in t.shape:
                self.vocab_numel = max(self.vocab_numel, t.numel())
            elif t.numel() > self.numel:
                self.numel, self.op = t.numel(), f"{func} {tuple(t.shape)}"
        return out


def _largest(trainer, n: int):
    rng = random.Random(n)
    s = Sample(index=0, group_index=0, prompt_ids=[rng.randrange(3, 900) for _ in range(16)],
               response_ids=[rng.randrange(3, 900) for _ in range(n - 15)])
    s.loss_mask, s.rollout_logprobs = [1] * len(s.response_ids), [-1.0] * len(s.response_ids)
    mb = pack([s], [0])
    assert mb.num_tokens == n and mb.segments.long     # one segment, long: exact blocks
    trainer.model.zero_grad(set_to_none=True)
    mode = LargestTensor(trainer.model.config.vocab_size)
    with mode:
        lp, ent = trainer._fwd(mb.input_ids, mb.position_ids, mb.attention(), mb.gather_index, mb.targets,
                               1.0, 128, True, True)
        (lp.sum() + 0.1 * ent.sum()).backward()
    return mode.numel, mode.op, mode.vocab_numel


@pytest.mark.parametrize("fused", [True, False])
def test_no_tensor_grows_with_the_square_of_a_long_sample(tiny_model_dir, fused):
    tr = Trainer(make_cfg(tiny_model_dir, disable_fused_layers=not fused))
    c = tr.model.config
    short, short_op, _ = _largest(tr, 2048)
    long, long_op, head = _largest(tr, 4096)
    assert 2048 >= LONG_ROWS and long <= 2.2 * short, (short, short_op, long, long_op)
    # one block's scores (heads x block rows x keys) or a layer's [tokens, 2 x intermediate] gate/up output
    bound = max(c.num_attention_heads * BLOCK_ROWS * 4096, 4096 * 2 * c.intermediate_size)
    assert long <= bound < 4096 * 4096, (long, long_op, bound)
    assert head <= WGRAD_ROWS * c.vocab_size      # the head: logits of at most WGRAD_ROWS positions at once
