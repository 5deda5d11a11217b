"""The acceptance model and the ideal speed-up.

* ideal speed-up = τ · t_step / (t_verify + t_draft): commit, bookkeeping and loop overhead are
  deliberately not in it; ``efficiency`` = measured speed-up ÷ ideal exposes them.
* The i.i.d. acceptance model: each draft is accepted with probability α independently, so
  P(at least i accepted) = α^i and E[τ] = (1 − α^{k+1}) / (1 − α).
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np


def ideal_speedup(tau: float, t_step: float, t_verify: float, t_draft: float) -> float:
    """τ · t_step / (t_verify + t_draft): the speed-up if commit, bookkeeping and loop were free."""
    return tau * t_step / (t_verify + t_draft)


def expected_tau(alpha: float | np.ndarray, k: int | np.ndarray) -> np.ndarray:
    """E[tokens per verify step] = (1 − α^{k+1}) / (1 − α) under i.i.d. acceptance α (k+1 at 1)."""
    alpha = np.asarray(alpha, np.float64)
    k = np.asarray(k, np.float64)
    with np.errstate(divide="ignore", invalid="ignore"):
        tau = (1.0 - alpha ** (k + 1)) / (1.0 - alpha)
    return np.where(np.isclose(alpha, 1.0), k + 1, tau)


def fit_alpha(position_acceptance: Sequence[Sequence[float]]) -> float:
    """Least-squares α for P(at least i drafts accepted) = α^i, pooled over runs.

    ``position_acceptance``: one list per run (any k), entry i−1 = measured fraction of verify
    steps that accepted ≥ i drafts (``GenerateResult.stats["position_acceptance"]``)."""
    pairs = [(i + 1, float(r)) for run in position_acceptance for i, r in enumerate(run)]
    if not pairs:
        raise ValueError("fit_alpha needs at least one measured acceptance rate")
    if any(not 0.0 <= r <= 1.0 for _, r in pairs):
        raise ValueError(f"acceptance rates must lie in [0, 1], got {[r for _, r in pairs]}")
    i = np.array([p[0] for p in pairs], np.float64)
    r = np.array([p[1] for p in pairs], np.float64)
    grid = np.linspace(0.0, 1.0, 100001)
    err = ((grid[:, None] ** i[None, :] - r[None, :]) ** 2).sum(axis=1)
    return float(grid[int(np.argmin(err))])
