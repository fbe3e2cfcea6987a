"""PPO advantages: GAE from a critic's values.

Token rewards are ``-kl_coef * (old_logprobs - ref_logprobs)`` (k1) on each
masked token plus the scalar reward at the last masked token; advantages come
from GAE with ``gamma`` and ``lambd`` over the masked tokens (see
``returns.gae``); returns = advantages + values on masked tokens (0 elsewhere).
Advantages are *not* whitened here: use ``normalize_advantages`` for that
(``--normalize-advantages``). ``values`` [B, T] is required.
"""
from __future__ import annotations

from .inputs import AdvantageInputs, AdvantageOutputs
from .returns import gae, kl_token_rewards
from .utils import check_groups


def ppo(inputs: AdvantageInputs) -> AdvantageOutputs:
    """PPO/GAE advantages [B, T] and returns [B, T] (= advantages + values)."""
    values = inputs.values
    grouped = check_groups(inputs.rewards, inputs.mask, inputs.group_size)
    if values is None:
        raise ValueError("advantage estimator 'ppo' needs values [B, T] from a critic; got values=None")
    params = inputs.params("ppo")
    mask = inputs.mask.float()
    token_r = kl_token_rewards(
        grouped.reshape(-1), mask, float(params.kl_coef), inputs.old_logprobs, inputs.ref_logprobs
    )
    adv = gae(token_r, values, mask, float(params.gamma), float(params.lambd))
    returns = (adv + values.detach().float()) * mask
    return AdvantageOutputs(adv, returns)
