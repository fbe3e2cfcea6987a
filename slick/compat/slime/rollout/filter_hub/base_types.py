"""slime's dynamic-sampling filter result: ``DynamicFilterOutput(keep, reason, keep_when_insufficient)``.

A filter (``--dynamic-sampling-filter-path``) may return it or a plain bool. ``keep=False`` drops the group;
``reason`` names why (slick counts drops per reason in ``rollout/dynamic_filter/drop_<reason>``);
``keep_when_insufficient=True`` keeps a rejected group anyway when dropping it would leave fewer groups than the
batch needs without sampling more (``slick.rollout.filters.verdict``).
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Optional


@dataclass
class DynamicFilterOutput:
    keep: bool
    reason: Optional[str] = None
    keep_when_insufficient: bool = False
