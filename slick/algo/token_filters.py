"""Which tokens carry the policy gradient, on top of any objective: OPSM and high-entropy ("forking") tokens.

* :func:`opsm_drop` (off-policy sequence masking, slime's ``--use-opsm``): a token leaves the policy loss when its
  advantage is negative and its sequence's KL to the old policy, ``mean over the sequence's loss tokens of
  (old - logprobs)``, exceeds ``--opsm-delta``. For outcome advantages (GRPO and the like) that is the whole
  sequence.
* :func:`high_entropy_keep` (the 80/20 paper, TRL's ``top_entropy_quantile``): only tokens whose entropy is at
  least the ``1 - ratio`` quantile (linear interpolation, ``torch.quantile``) of the micro-batch's loss tokens'
  entropies keep their policy gradient.

Both return float ``[B, T]`` indicators without gradient.
"""
from __future__ import annotations

import torch
from torch import Tensor


def opsm_drop(logprobs: Tensor, old_logprobs: Tensor, advantages: Tensor, mask: Tensor, delta: float) -> Tensor:
    """1.0 on the tokens OPSM takes out of the loss (module doc), else 0.0."""
    with torch.no_grad():
        m = mask.float()
        seq_kl = ((old_logprobs.float() - logprobs.float()) * m).sum(-1) / m.sum(-1).clamp(min=1.0)
        return ((advantages < 0) & (seq_kl > delta).unsqueeze(-1)).float()


def high_entropy_keep(entropy: Tensor, mask: Tensor, ratio: float) -> Tensor:
    """1.0 on the loss tokens among the top ``ratio`` by entropy (module doc), else 0.0; all loss tokens when
    ``ratio`` is 1."""
    if not 0.0 < ratio <= 1.0:
        raise ValueError(f"high-entropy token ratio must be in (0, 1], got {ratio}")
    with torch.no_grad():
        on = mask > 0
        if ratio == 1.0 or not bool(on.any()):
            return on.float()
        threshold = torch.quantile(entropy[on].float(), 1.0 - ratio)
        return ((entropy.float() * mask.float() >= threshold) & on).float()
