"""Statistical checks shared by the sampler tests: Pearson's chi-square goodness-of-fit test.

A sampler test draws n tokens with fixed seeds and asks whether their counts fit the distribution the
sampler should follow. ``ALPHA`` is the false-failure rate: a correct sampler fails the check with
probability 1e-4 per seed (the seeds are fixed, so a given test either always passes or always fails).
At n = 4000 a sampler that halves the probability of a p = 0.05 token gives a statistic near 50, against a
critical value of 21.1 (df = 3), so it fails (``test_frequency_check_rejects_a_halved_token``).
"""
from __future__ import annotations

from typing import Sequence

import torch

ALPHA = 1e-4


def chi_square_pvalue(counts: torch.Tensor, probs: torch.Tensor) -> float:
    """P(X >= statistic) for X ~ chi-square with (categories - 1) degrees of freedom, over categories with
    probs > 0. Each expected count must be at least 5 (below that the chi-square approximation is poor)."""
    counts, probs = counts.double(), probs.double()
    n = counts.sum()
    expected = n * probs / probs.sum()
    if bool((expected < 5).any()):
        raise ValueError(f"expected counts {expected.tolist()} include some below 5: draw more samples")
    stat = ((counts - expected) ** 2 / expected).sum()
    df = probs.numel() - 1
    # the chi-square survival function is the regularized upper incomplete gamma Q(df/2, stat/2)
    return float(torch.special.gammaincc(torch.tensor(df / 2, dtype=torch.float64), stat / 2))


def assert_frequencies(tokens: Sequence[int], probs: Sequence[float], alpha: float = ALPHA) -> None:
    """Tokens with probability 0 never appear and the others' counts pass the chi-square test at ``alpha``."""
    probs = torch.as_tensor(probs, dtype=torch.float64)
    counts = torch.bincount(torch.as_tensor(list(tokens)), minlength=probs.numel()).double()
    assert counts.numel() == probs.numel(), f"token ids beyond the {probs.numel()} expected: {counts.tolist()}"
    support = probs > 0
    assert counts[~support].sum() == 0, f"tokens with probability 0 were drawn: counts {counts.tolist()}"
    pvalue = chi_square_pvalue(counts[support], probs[support])
    assert pvalue >= alpha, (f"counts {counts.tolist()} do not fit probabilities {probs.tolist()}: "
                             f"chi-square p-value {pvalue:.3g} < alpha {alpha}")
