"""slime's module names for plug-ins written for slime, when slime itself is not installed.

``from slime.utils.types import Sample``, ``from slime.utils.http_utils import post``,
``from slime.rollout.sglang_rollout import GenerateState, generate, get_model_url`` and
``from slime.rollout.filter_hub.base_types import DynamicFilterOutput``, ``slime.utils.misc.load_function``,
``slime.utils.async_utils.run``, ``slime.rollout.base_types`` and ``slime.rollout.rm_hub`` (``async_rm``,
``batched_async_rm``, ``math_utils``, ``math_dapo_utils``, ``deepscaler``) and ``slime.utils.mask_utils`` resolve here
(``slick.compat.finder``). Only what plug-ins use is offered: a custom generate function with slime's
signature, slime's filter results and its built-in filters. How slick runs them: docs/slime.md.
"""
