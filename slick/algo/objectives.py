"""The policy-gradient objectives of ``--policy-loss``: one per-token loss function each (verl's names).

Every function takes the typed settings and one micro-batch, ``fn(p, logprobs, old, adv, mask) -> PolicyTerms``,
all ``[B, T]``: ``logprobs`` (fp32, carries the gradient), ``old`` (the ratio's denominator, constant), ``adv``
(constant) and the float loss ``mask``. With ``r = exp(logprobs - old)`` and ``A`` the advantage, per token:

* ``vanilla`` (PPO / GRPO): ``max(-A r, -A clip(r, 1 - eps, 1 + eps_high))``, dual clip with ``--eps-clip-c``;
* ``gspo``: the same with GSPO's sequence ratio (``slick.algo.policy_loss``); also what
  ``--advantage-estimator gspo`` selects;
* ``cispo`` (MiniMax-M1): ``-sg[clip(r, 1 - eps_low, 1 + eps_high)] A logprobs``;
* ``sapo`` (soft adaptive policy optimisation): ``-A (4 / tau) sigmoid(tau (r - 1))``, ``tau`` = ``--sapo-tau-pos``
  where ``A > 0``, else ``--sapo-tau-neg``;
* ``gpg`` (group policy gradient): ``-A logprobs``;
* ``gmpo`` (geometric-mean policy optimisation, verl's ``geo_mean``): per sequence ``-A_i exp(mean_t sgn(A)
  min(sgn(A) d_t, sgn(A) clip(d_t, -eps, eps_high)))`` with ``d = logprobs - old`` and ``A_i`` the sequence's mean
  advantage, the same value on each of its tokens;
* ``clip_cov`` / ``kl_cov`` (the entropy-mechanism paper): PPO's clipped loss with the gradient of a few
  high-covariance tokens cut, or the unclipped ``-A r`` plus ``--ppo-kl-coef * |d|`` on the top-covariance tokens,
  where the covariance of a token is ``(A - mean A)(logprobs - mean logprobs)`` over the micro-batch's tokens.

``clip_cov`` draws its tokens at random among the candidates (``torch.randperm``, the default generator, as verl).
The formulas, papers and the reference each was checked against: docs/algorithms.md, "Policy losses".
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Callable

import torch
from torch import Tensor

from .params import AlgoParams
from .policy_loss import policy_terms
from .utils import masked_mean

LOG_RATIO_CLAMP = 20.0   # cispo and sapo clamp the log ratio to +-20 before exp (as verl)


@dataclass
class PolicyTerms:
    """One objective's per-token loss and metrics, each ``[B, T]``: ``clipped`` (1.0 where its clip acted: the
    ``pg_clipfrac`` metric), ``neg_log_ratio`` (old - new, the ``ppo_kl`` metric), ``extra`` (more per-token metrics,
    reduced like the loss), ``per_sequence`` (the loss is one value per sequence on each of its tokens: rollout
    weights then apply as one per-sequence weight, their geometric mean)."""

    loss: Tensor
    clipped: Tensor
    neg_log_ratio: Tensor
    extra: dict = field(default_factory=dict)
    per_sequence: bool = False


def clip_range(p: AlgoParams) -> tuple[float, float]:
    """``(eps_low, eps_high)`` of the ratio clip: --eps-clip and --eps-clip-high (default --eps-clip)."""
    return float(p.eps_clip), float(p.eps_clip if p.eps_clip_high is None else p.eps_clip_high)


def loss_name(p: AlgoParams) -> str:
    """The objective a run trains: --policy-loss, where ``vanilla`` with --advantage-estimator gspo is ``gspo``."""
    if p.policy_loss == "vanilla" and p.advantage_estimator == "gspo":
        return "gspo"
    return p.policy_loss


def vanilla(p: AlgoParams, lp: Tensor, old: Tensor, adv: Tensor, mask: Tensor) -> PolicyTerms:
    lo, hi = clip_range(p)
    loss, clipped, nlr = policy_terms(lp, old, adv, mask, lo, hi, p.eps_clip_c)
    return PolicyTerms(loss, clipped, nlr)


def gspo(p: AlgoParams, lp: Tensor, old: Tensor, adv: Tensor, mask: Tensor) -> PolicyTerms:
    lo, hi = clip_range(p)
    loss, clipped, nlr = policy_terms(lp, old, adv, mask, lo, hi, p.eps_clip_c, sequence_level=True)
    return PolicyTerms(loss, clipped, nlr)


def cispo(p: AlgoParams, lp: Tensor, old: Tensor, adv: Tensor, mask: Tensor) -> PolicyTerms:
    lo, hi = clip_range(p)
    lo = lo if p.cispo_eps_low is None else float(p.cispo_eps_low)
    hi = hi if p.cispo_eps_high is None else float(p.cispo_eps_high)
    log_ratio = (lp.detach() - old).clamp(-LOG_RATIO_CLAMP, LOG_RATIO_CLAMP)
    ratio = torch.exp(log_ratio)
    weight = ratio.clamp(1.0 - lo, 1.0 + hi)
    return PolicyTerms(-weight * adv * lp, (weight != ratio).to(lp.dtype), -log_ratio)


def sapo(p: AlgoParams, lp: Tensor, old: Tensor, adv: Tensor, mask: Tensor) -> PolicyTerms:
    log_ratio = (lp - old).clamp(-LOG_RATIO_CLAMP, LOG_RATIO_CLAMP)
    ratio = torch.exp(log_ratio)
    tau = torch.where(adv > 0, torch.full_like(adv, float(p.sapo_tau_pos)), torch.full_like(adv, float(p.sapo_tau_neg)))
    sig = torch.sigmoid(tau * (ratio - 1.0))
    gate = sig * (4.0 / tau)
    soft = (4.0 * sig * (1.0 - sig)).detach() < 0.9   # the gradient's weight fell below 0.9 (slime's measure)
    return PolicyTerms(-gate * adv, soft.to(lp.dtype), -log_ratio.detach(), {"sapo_gate_mean": gate.detach()})


def gpg(p: AlgoParams, lp: Tensor, old: Tensor, adv: Tensor, mask: Tensor) -> PolicyTerms:
    return PolicyTerms(-lp * adv, torch.zeros_like(lp), (old - lp).detach())


def gmpo(p: AlgoParams, lp: Tensor, old: Tensor, adv: Tensor, mask: Tensor) -> PolicyTerms:
    lo, hi = clip_range(p)
    d = lp - old
    sgn = torch.sign(adv)
    d_clip = d.clamp(-lo, hi)
    d_min = sgn * torch.minimum(sgn * d, sgn * d_clip)
    n = mask.sum(-1)
    ratio = torch.exp((d_min * mask).sum(-1) / (n + 1e-8))
    seq_adv = (adv * mask).sum(-1) / (n + 1e-8)
    loss = (-seq_adv * ratio).unsqueeze(-1).expand_as(lp)
    clipped = ((d.detach() != d_clip.detach()) & (adv != 0)).to(lp.dtype)
    return PolicyTerms(loss, clipped, -d.detach(), per_sequence=True)


def clip_cov(p: AlgoParams, lp: Tensor, old: Tensor, adv: Tensor, mask: Tensor) -> PolicyTerms:
    lo, hi = clip_range(p)
    d = lp - old
    ratio = torch.exp(d)
    l1 = -adv * ratio
    l2 = -adv * ratio.clamp(1.0 - lo, 1.0 + hi)
    on = mask > 0
    clipped = (l2 > l1) & on
    lpd = lp.detach()
    cov = (adv - masked_mean(adv, mask)) * (lpd - masked_mean(lpd, mask))
    candidates = torch.nonzero((cov < float(p.clip_cov_ub)) & (cov > float(p.clip_cov_lb)) & on & ~clipped)
    keep = torch.ones_like(lp)
    if len(candidates):
        count = max(int(float(p.clip_cov_ratio) * float(mask.sum())), 1)
        chosen = candidates[torch.randperm(len(candidates))[:count]]
        keep[chosen[:, 0], chosen[:, 1]] = 0.0
    loss = torch.maximum(l1, l2) * keep
    return PolicyTerms(loss, clipped.to(lp.dtype), -d.detach(), {"clip_cov_frac": 1.0 - keep})


def kl_cov(p: AlgoParams, lp: Tensor, old: Tensor, adv: Tensor, mask: Tensor) -> PolicyTerms:
    d = lp - old
    l1 = -adv * torch.exp(d)
    on = (mask > 0).reshape(-1)
    chosen = torch.zeros(lp.numel(), dtype=torch.bool, device=lp.device)
    idx = torch.nonzero(on, as_tuple=True)[0]
    if len(idx):
        a, l = adv.reshape(-1)[idx], lp.detach().reshape(-1)[idx]
        cov = (a - a.mean()) * (l - l.mean())
        top = torch.topk(cov, max(1, int(len(cov) * float(p.kl_cov_ratio))), largest=True).indices
        chosen[idx[top]] = True
    chosen = chosen.view_as(lp)
    loss = torch.where(chosen, l1 + float(p.ppo_kl_coef) * d.abs(), l1)
    return PolicyTerms(loss, torch.zeros_like(lp), -d.detach(), {"kl_cov_frac": chosen.to(lp.dtype)})


POLICY_LOSSES: dict[str, Callable[..., PolicyTerms]] = {
    "vanilla": vanilla, "gspo": gspo, "cispo": cispo, "sapo": sapo, "gpg": gpg, "gmpo": gmpo,
    "clip_cov": clip_cov, "kl_cov": kl_cov,
}
# losses whose tokens are chosen over the whole micro-batch: a sample's gradient is not zero just because its
# advantages are (kl_cov's KL term), and leaving samples out would change which tokens are chosen
BATCH_COUPLED = ("clip_cov", "kl_cov")


def policy_objective_terms(p: AlgoParams, lp: Tensor, old: Tensor, adv: Tensor, mask: Tensor) -> PolicyTerms:
    """The per-token terms of the run's objective (:func:`loss_name`)."""
    name = loss_name(p)
    if name not in POLICY_LOSSES:
        raise ValueError(f"unknown --policy-loss {name!r} (choose from {', '.join(POLICY_LOSSES)})")
    if not (lp.shape == old.shape == adv.shape == mask.shape):
        raise ValueError(f"policy loss inputs must share one shape [B, T]: logprobs {tuple(lp.shape)}, old "
                         f"{tuple(old.shape)}, advantages {tuple(adv.shape)}, mask {tuple(mask.shape)}")
    lp = lp.float()
    return POLICY_LOSSES[name](p, lp, old.detach().to(lp.dtype), adv.detach().to(lp.dtype), mask.to(lp.dtype))
