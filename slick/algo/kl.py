"""Per-token KL estimators between the policy and a reference policy.

With ``d = logprobs - ref_logprobs`` (log pi - log pi_ref, per token), following
Schulman's "Approximating KL divergence" note:

* ``k1``         = d
* ``k2``         = d**2 / 2
* ``k3``         = exp(-d) - 1 + d        (= r - 1 - log r with r = pi_ref / pi; >= 0)
* ``low_var_kl`` = k3 clamped to [-10, 10] (in practice [0, 10], since k3 >= 0)

No mask is applied here; reduce with ``reduce`` (or ``masked_mean``).
"""
from __future__ import annotations

import torch
from torch import Tensor

KL_KINDS = ("k1", "k2", "k3", "low_var_kl")
LOW_VAR_KL_CLAMP = 10.0


def kl(logprobs: Tensor, ref_logprobs: Tensor, kind: str) -> Tensor:
    """Per-token KL estimate of ``kind`` (one of k1, k2, k3, low_var_kl), same shape as the inputs."""
    if kind not in KL_KINDS:
        raise ValueError(f"unknown KL type {kind!r}; choose one of: {', '.join(KL_KINDS)}")
    if logprobs.shape != ref_logprobs.shape:
        raise ValueError(
            f"logprobs {tuple(logprobs.shape)} and ref_logprobs {tuple(ref_logprobs.shape)} must have the same shape"
        )
    d = logprobs.float() - ref_logprobs.float()
    if kind == "k1":
        return d
    if kind == "k2":
        return 0.5 * d * d
    k3 = torch.exp(-d) - 1.0 + d
    if kind == "low_var_kl":
        k3 = k3.clamp(min=-LOW_VAR_KL_CLAMP, max=LOW_VAR_KL_CLAMP)
    return k3
