"""slime's loss-side hooks, called with slime's arguments inside the policy objective (slick/algo/objective.py).

slime hands these hooks one micro-batch as *packed* tensors: every sample's response tokens one after the other
(a 1-D tensor of ``sum(response_lengths)`` values) and per-sample lists. slick's micro-batch is ``[B, T]``, right-
padded; :class:`SlimeLossHooks` builds slime's layout for the call and turns the result back into ``[B, T]``.

- ``--custom-tis-function-path`` (with ``--use-tis``, as in slime): ``fn(args, *, pg_loss, train_log_probs,
  rollout_log_probs, loss_masks, total_lengths, response_lengths) -> (pg_loss, loss_masks, metrics)``, in place
  of ``--use-tis``'s clamped weights. ``pg_loss`` is the per-token policy loss (packed, with its gradient);
  ``train_log_probs`` the trainer's old logprobs (the training forward's own, detached, when the step is
  on-policy), ``rollout_log_probs`` the engine's, ``loss_masks`` the loss masks, each a list of per-sample 1-D
  tensors. The returned ``pg_loss`` (packed) is what is reduced, the returned ``loss_masks`` zero tokens out of
  its numerator (the denominators stay the original masks', as in slime), and every ``metrics`` value (a packed
  per-token tensor) is reduced like the loss over the original masks and logged under its own key
  (``train/<key>``). ``--use-mis`` still applies after it.
- ``--custom-pg-loss-reducer-function-path``: ``fn(total_lengths, response_lengths, loss_masks,
  calculate_per_token_loss) -> reducer``; ``reducer(pg_loss)`` (packed) gives the micro-batch's policy-loss
  *sum*, as slime's ``sum_of_sample_mean`` does: slick divides it by the step's samples (or, with
  ``--calculate-per-token-loss``, its loss tokens), as slime's loss scaling does. The masks are the TIS
  function's when one ran, as in slime. Other terms and metrics keep slick's reduction.

``total_lengths`` (prompt + response tokens) and ``response_lengths`` are each sample's, as slime gives them
(the trainer puts them in the loss inputs). Loss inputs built without them (a plug-in calling the objective
itself) give ``response_lengths`` up to each sample's last loss-masked token, and ``total_lengths`` of
placeholders that may be passed along, as to slime's context-parallel helpers
(``slime.backends.megatron_utils.cp_utils``, whose single-rank forms slick offers), and raise a ValueError
naming the flag when a value is used. ``args`` is the run's flags as a namespace.
"""
from __future__ import annotations

import argparse
from dataclasses import dataclass
from typing import Callable, Optional

import torch
import torch.nn.functional as F
from torch import Tensor

from slick.config import Config
from slick.plugins import load_function

TIS_FLAG = "--custom-tis-function-path"
REDUCER_FLAG = "--custom-pg-loss-reducer-function-path"


class UnknownLength:
    """One entry of slime's ``total_lengths``, which slick's loss inputs do not carry: it can be passed along (to
    slime's context-parallel helpers, which ignore it without context parallelism), and any use of its value
    raises a ValueError naming the flag."""

    __slots__ = ("flag",)

    def __init__(self, flag: str):
        self.flag = flag

    def _refuse(self, *_a, **_k):
        raise ValueError(f"{self.flag}: slick gives no total_lengths values (prompt + response lengths; slime "
                         f"reads them only for context parallelism); use response_lengths and loss_masks")

    __int__ = __index__ = __float__ = __bool__ = __add__ = __radd__ = __sub__ = __rsub__ = __mul__ = __rmul__ = \
        __truediv__ = __rtruediv__ = __floordiv__ = __rfloordiv__ = __lt__ = __le__ = __gt__ = __ge__ = _refuse

    def __repr__(self) -> str:
        return "<total length not given by slick>"


def lengths_of(inputs, mask: Tensor, flag: str) -> tuple[list, list[int]]:
    """slime's ``(total_lengths, response_lengths)`` of the micro-batch: the loss inputs' own, else (see the
    module's docstring) placeholders and each row's length up to its last loss-masked token."""
    prompts, responses = getattr(inputs, "prompt_lengths", None), getattr(inputs, "response_lengths", None)
    if prompts is not None and responses is not None:
        return [int(p) + int(r) for p, r in zip(prompts, responses)], [int(r) for r in responses]
    lengths = response_lengths(mask)
    return [UnknownLength(flag) for _ in lengths], lengths


def response_lengths(mask: Tensor) -> list[int]:
    """Each row's length up to its last nonzero mask entry (0 for a row with none)."""
    m = mask.detach() != 0
    idx = torch.arange(1, m.shape[-1] + 1, device=m.device).expand_as(m)
    return [int(x) for x in (idx * m).amax(dim=-1).tolist()] if m.numel() else [0] * m.shape[0]


def pack(x: Tensor, lengths: list[int]) -> Tensor:
    """``[B, T]`` -> slime's packed 1-D tensor of each row's first ``lengths[i]`` values (keeps the gradient)."""
    return torch.cat([x[i, :n] for i, n in enumerate(lengths)]) if lengths else x.new_zeros(0)


def rows(x: Tensor, lengths: list[int]) -> list[Tensor]:
    """``[B, T]`` -> slime's list of per-sample 1-D tensors."""
    return [x[i, :n] for i, n in enumerate(lengths)]


def unpack(flat: Tensor, lengths: list[int], width: int) -> Tensor:
    """slime's packed 1-D tensor -> ``[B, width]``, zero-padded (keeps the gradient)."""
    return torch.stack([F.pad(p, (0, width - p.shape[0])) for p in flat.split(lengths)]) if lengths else \
        flat.new_zeros(0, width)


@dataclass(frozen=True, eq=False)
class SlimeLossHooks:
    """The run's slime loss hooks (build with :meth:`from_config`; None when neither flag is set). Picklable:
    the functions are module-level and travel by reference to trainer ranks."""

    args: argparse.Namespace
    tis: Optional[Callable] = None
    reducer: Optional[Callable] = None

    @classmethod
    def from_config(cls, cfg: Config) -> Optional["SlimeLossHooks"]:
        tis = load_function(cfg.custom_tis_function_path, TIS_FLAG) if cfg.use_tis else None
        reducer = load_function(cfg.custom_pg_loss_reducer_function_path, REDUCER_FLAG)
        if tis is None and reducer is None:
            return None
        return cls(args=argparse.Namespace(**cfg.flat()), tis=tis, reducer=reducer)

    def correct(self, pg: Tensor, old: Tensor, rollout_logprobs: Optional[Tensor], mask: Tensor, red,
                metrics: dict, inputs=None) -> tuple[Tensor, Tensor, list]:
        """slime's TIS function on ``pg`` ``[B, T]``: ``(pg_loss [B, T], its loss masks [B, T], the loss masks as
        it returned them)``; the function's metrics, reduced by ``red`` (the original masks), go into
        ``metrics``. ``inputs``: the micro-batch's loss inputs (their sample lengths)."""
        if rollout_logprobs is None:
            raise ValueError(f"{TIS_FLAG}: needs the engine's logprobs of every response token (rollout_logprobs); "
                             f"the micro-batch has none")
        totals, lengths = lengths_of(inputs, mask, TIS_FLAG)
        width = mask.shape[-1]
        out = self.tis(args=self.args, pg_loss=pack(pg, lengths),
                       train_log_probs=rows(old.detach().float(), lengths),
                       rollout_log_probs=rows(rollout_logprobs.detach().float(), lengths),
                       loss_masks=rows(mask.int(), lengths), total_lengths=totals, response_lengths=list(lengths))
        if not (isinstance(out, (tuple, list)) and len(out) == 3):
            raise ValueError(f"{TIS_FLAG}: must return (pg_loss, loss_masks, metrics), got {type(out).__name__}")
        new_pg, new_masks, tis_metrics = out
        total = sum(lengths)
        if not isinstance(new_pg, Tensor) or tuple(new_pg.shape) != (total,):
            raise ValueError(f"{TIS_FLAG}: returned pg_loss of shape {tuple(getattr(new_pg, 'shape', ()))}; it "
                             f"must be the packed ({total},) tensor it was given")
        new_masks = list(new_masks)
        if len(new_masks) != len(lengths) or any(len(m) != n for m, n in zip(new_masks, lengths)):
            raise ValueError(f"{TIS_FLAG}: returned loss_masks of lengths {[len(m) for m in new_masks]}; they must "
                             f"match response_lengths {lengths}")
        mod = unpack(torch.cat([torch.as_tensor(m, dtype=pg.dtype, device=pg.device).reshape(-1)
                                for m in new_masks]) if new_masks else pg.new_zeros(0), lengths, width)
        for key, value in (tis_metrics or {}).items():
            value = torch.as_tensor(value, device=pg.device)
            if tuple(value.shape) != (total,):
                raise ValueError(f"{TIS_FLAG}: metric {key!r} has shape {tuple(value.shape)}; metrics are packed "
                                 f"per-token ({total},) tensors, reduced like the loss")
            metrics[key] = float(red(unpack(value.detach().to(pg.dtype), lengths, width)))
        return unpack(new_pg.to(pg.dtype), lengths, width), mod, new_masks

    def reduce_pg(self, pg: Tensor, loss_masks: Optional[list], mask: Tensor, per_token: bool,
                  num_samples: Optional[float], num_tokens: Optional[float], inputs=None) -> Tensor:
        """The policy loss of ``pg`` ``[B, T]`` by slime's reducer over ``loss_masks`` (the TIS function's, as it
        returned them; None: the loss mask's rows), divided as slime's loss scaling divides it: by
        ``num_samples`` (the step's samples), or with ``per_token`` by ``num_tokens``; unset, this micro-batch's."""
        totals, lengths = lengths_of(inputs, mask, REDUCER_FLAG)
        masks = rows(mask.int(), lengths) if loss_masks is None else loss_masks
        reducer = self.reducer(totals, list(lengths), masks, per_token)
        if not callable(reducer):
            raise ValueError(f"{REDUCER_FLAG}: must return the reducer function, got {type(reducer).__name__}")
        total = reducer(pack(pg, lengths))
        if not isinstance(total, Tensor) or total.numel() != 1:
            raise ValueError(f"{REDUCER_FLAG}: the reducer must return a scalar tensor, got "
                             f"{type(total).__name__} {tuple(getattr(total, 'shape', ()))}")
        if per_token:
            denom = float(mask.sum().clamp(min=1.0)) if num_tokens is None else float(num_tokens)
        else:
            denom = float(mask.shape[0]) if num_samples is None else float(num_samples)
        return total.reshape(()) / denom
