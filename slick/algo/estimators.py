"""Registry of advantage estimators and batch-level advantage normalisation.

Every estimator has the signature (see ``inputs.py``)::

    estimator(inputs: AdvantageInputs) -> AdvantageOutputs(advantages[B, T], returns[B, T])

A custom advantage function (``--custom-advantage-function-path``) follows the
same signature; the caller resolves the dotted path and checks the signature
(``inputs.check_plugin_signature``).

``ESTIMATORS`` is the one list of estimator names: its keys are the choices of
``--advantage-estimator`` (``slick.config`` reads them from here when it builds the
parser, the flag docs or validates a config), so registering one here is enough.
"""
from __future__ import annotations

from typing import Callable

from torch import Tensor

from .grpo import grpo, gspo
from .inputs import AdvantageInputs, AdvantageOutputs
from .ppo import ppo
from .reinforce import reinforce_plus_plus, reinforce_plus_plus_baseline
from .rloo import rloo
from .utils import masked_whiten

Estimator = Callable[[AdvantageInputs], AdvantageOutputs]

ESTIMATORS: dict[str, Estimator] = {
    "grpo": grpo,
    "gspo": gspo,
    "ppo": ppo,
    "reinforce_plus_plus": reinforce_plus_plus,
    "reinforce_plus_plus_baseline": reinforce_plus_plus_baseline,
    "rloo": rloo,
}


def get_estimator(name: str) -> Estimator:
    """Return the estimator registered as ``name``; a ValueError lists the choices otherwise."""
    try:
        return ESTIMATORS[name]
    except KeyError:
        raise ValueError(
            f"unknown advantage estimator {name!r}; choose one of: {', '.join(sorted(ESTIMATORS))}"
        ) from None


def normalize_advantages(adv: Tensor, mask: Tensor) -> Tensor:
    """Whiten advantages over all masked tokens of the batch (``--normalize-advantages``)."""
    return masked_whiten(adv, mask.to(adv.dtype))
