"""The one interval function of the regime study, kept apart so that it can be swapped for the project's
shared bootstrap: a ratio of sums over prompts (Σ num / Σ den) with a 95 % percentile interval that resamples
prompts with replacement."""
from __future__ import annotations

import numpy as np

CONFIDENCE = 0.95
N_BOOT = 2000


def prompt_interval(num, den, n_boot: int = N_BOOT, seed: int = 0) -> list[float]:
    """[point, lo, hi] of Σ num / Σ den over prompts (arrays of one value per prompt)."""
    num, den = np.asarray(num, dtype=float), np.asarray(den, dtype=float)
    if len(num) == 0:
        return [float("nan")] * 3
    rng = np.random.default_rng(seed)
    idx = rng.integers(0, len(num), size=(n_boot, len(num)))  # (B, P)
    dist = num[idx].sum(1) / den[idx].sum(1)
    a = (1 - CONFIDENCE) / 2
    return [float(num.sum() / den.sum()), float(np.quantile(dist, a)), float(np.quantile(dist, 1 - a))]
