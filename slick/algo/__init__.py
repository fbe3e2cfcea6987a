"""slick.algo: RL advantage estimators and policy losses as pure torch functions.

Imports torch and the standard library only. Conventions: a batch of B samples
ordered group by group (``group_size`` consecutive samples per prompt); padded
tensors [B, T] with a float ``mask`` [B, T] that is 1.0 on the response tokens
that count and 0.0 elsewhere. See docs/algorithms.md.
"""
from .batch import TrainBatch
from .estimators import ESTIMATORS, get_estimator, normalize_advantages
from .grpo import grpo, gspo
from .inputs import AdvantageInputs, AdvantageOutputs, LossInputs, check_plugin_signature
from .kl import KL_KINDS, kl
from .objective import compute_policy_objective
from .params import AlgoParams
from .policy_loss import policy_loss, tis_weights
from .ppo import ppo
from .reduce import reduce
from .reinforce import reinforce_plus_plus, reinforce_plus_plus_baseline
from .returns import discounted_returns, gae, kl_token_rewards
from .rloo import rloo
from .utils import masked_mean, masked_sum, masked_whiten
from .value import explained_variance, value_loss

__all__ = [
    "AdvantageInputs",
    "AlgoParams",
    "AdvantageOutputs",
    "TrainBatch",
    "LossInputs",
    "check_plugin_signature",
    "ESTIMATORS",
    "KL_KINDS",
    "compute_policy_objective",
    "discounted_returns",
    "explained_variance",
    "gae",
    "get_estimator",
    "grpo",
    "gspo",
    "kl",
    "kl_token_rewards",
    "masked_mean",
    "masked_sum",
    "masked_whiten",
    "normalize_advantages",
    "policy_loss",
    "ppo",
    "reduce",
    "reinforce_plus_plus",
    "reinforce_plus_plus_baseline",
    "rloo",
    "tis_weights",
    "value_loss",
]
