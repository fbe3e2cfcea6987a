"""Prompt-shared packing: the n samples of a prompt share one copy of it (tree attention mask)."""
import random

import torch

from slick.train.packing import pack_shared_prompts, shares_prompts
from slick.train.trainer import Trainer
from slick.types import Sample
from tests.test_train import make_cfg, reference_logprobs, simple_loss
from tests.batches import batch_of


def grouped_samples(groups=3, n=4, seed=0, vocab=1000):
    rng = random.Random(seed)
    out = []
    for g in range(groups):
        prompt = [rng.randrange(3, vocab) for _ in range(rng.randint(2, 7))]
        for _ in range(n):
            r = [rng.randrange(3, vocab) for _ in range(rng.randint(1, 6))]
            out.append(Sample(index=len(out), group_index=g, prompt_ids=list(prompt), response_ids=r,
                              loss_mask=[1] * len(r), rollout_logprobs=[-1.0] * len(r)))
    return out


def test_shared_layout_by_hand():
    a = Sample(prompt_ids=[5, 6, 7], response_ids=[8, 9])
    b = Sample(prompt_ids=[5, 6, 7], response_ids=[11, 12, 13])
    c = Sample(prompt_ids=[20], response_ids=[21])
    assert shares_prompts([a, b, c], [0, 1, 2]) and not shares_prompts([a, c], [0, 1])
    mb = pack_shared_prompts([a, b, c], [2, 0, 1])  # output order follows the given indices
    #            prompt   a[:-1]  b[:-1]   c prompt (c's response has one token: no segment)
    assert mb.input_ids.tolist() == [[20, 5, 6, 7, 8, 11, 12]]
    assert mb.position_ids.tolist() == [[0, 0, 1, 2, 3, 3, 4]]
    assert mb.gather_index.tolist() == [0, 3, 4, 3, 5, 6]
    assert mb.targets.tolist() == [21, 8, 9, 11, 12, 13]
    assert mb.response_lengths == [1, 2, 3]
    m = mb.attention_mask[0, 0].int().tolist()
    assert m[4] == [0, 1, 1, 1, 1, 0, 0]   # a's token sees the prompt and itself
    assert m[5] == [0, 1, 1, 1, 0, 1, 0]   # b's first token does not see a's segment
    assert m[6] == [0, 1, 1, 1, 0, 1, 1]
    assert m[2] == [0, 1, 1, 0, 0, 0, 0]   # the prompt stays causal


def test_shared_logprobs_and_gradients_equal_separate_sequences(tiny_model_dir):
    samples = grouped_samples()
    shared = Trainer(make_cfg(tiny_model_dir, micro_batch_size=6, rollout_temperature=0.7))
    separate = Trainer(make_cfg(tiny_model_dir, micro_batch_size=6, rollout_temperature=0.7,
                                disable_prompt_sharing=True))
    for s, lp in zip(samples, shared.compute_logprobs(samples)):
        ref = reference_logprobs(shared.model, s, temperature=0.7)
        assert torch.allclose(lp, ref, atol=1e-5, rtol=0), (lp - ref).abs().max()
    adv = [torch.full((len(s.response_ids),), float(i % 3) - 1.0) for i, s in enumerate(samples)]
    shared.forward_backward(batch_of(samples, adv), simple_loss)
    separate.forward_backward(batch_of(samples, adv), simple_loss)
    grads = [(a.grad, b.grad) for a, b in zip(shared.model.parameters(), separate.model.parameters())
             if a.grad is not None]
    assert grads and all(torch.allclose(a, b, atol=1e-5, rtol=1e-4) for a, b in grads)
    packed_tokens = shared._pack(samples, list(range(6))).num_tokens
    assert packed_tokens < separate._pack(samples, list(range(6))).num_tokens
