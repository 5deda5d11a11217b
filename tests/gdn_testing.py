"""Random inputs for gated-delta-rule tests, and the relative-error measure they use."""

from __future__ import annotations

import jax.numpy as jnp
import numpy as np


def random_gdn_inputs(
    seed: int,
    b: int,
    t: int,
    hk: int,
    r: int,
    dk: int,
    dv: int,
    *,
    with_state: bool = True,
    dtype=jnp.float32,
    decay_scale: float = 1.0,
):
    """Well-conditioned GDN inputs as the layer produces them: q, k L2-normalised, g <= 0,
    beta in (0, 1). Returns (q, k, v, g, beta, initial_state or None)."""
    rng = np.random.default_rng(seed)
    hv = hk * r

    def unit(shape):
        x = rng.standard_normal(shape)
        return x / np.linalg.norm(x, axis=-1, keepdims=True)

    q = unit((b, t, hk, dk))
    k = unit((b, t, hk, dk))
    v = rng.standard_normal((b, t, hv, dv))
    g = -decay_scale * np.log1p(np.exp(rng.standard_normal((b, t, hv)) - 1.0))  # -softplus
    beta = 1.0 / (1.0 + np.exp(-rng.standard_normal((b, t, hv))))
    s0 = rng.standard_normal((b, hv, dk, dv)) * 0.5 if with_state else None
    cast = lambda x: jnp.asarray(x, dtype)  # noqa: E731
    return (
        cast(q),
        cast(k),
        cast(v),
        cast(g),
        cast(beta),
        None if s0 is None else jnp.asarray(s0, jnp.float32),
    )


def rel_err(actual, expected, floor: float = 1e-30) -> float:
    """max |actual − expected| / max(max |expected|, floor) (float64 on host). ``floor``: the
    magnitude of the terms that make ``expected`` where cancellation can make it much smaller
    (``output_scale``), so float32 rounding of those terms is not read as a relative error."""
    a = np.asarray(actual, np.float64)
    e = np.asarray(expected, np.float64)
    return float(np.max(np.abs(a - e)) / max(np.max(np.abs(e)), floor))


def output_scale(v, s0, dk: int) -> float:
    """The size of the terms summed into a GDN output: |o_t| = dk^-½ |Sᵀ q_t| with S built from
    β k vᵀ writes on top of s0, so its terms are ~ dk^-½ · max(|v|, |s0|) for unit q, k. An output
    can be far smaller (q_t nearly orthogonal to every key written: one random example with
    q·k = −6e-4 gave |o| ~ 2.5e-4 and a float32 difference of 1.2e-8 between two exact forms,
    a "relative error" of 5e-5); errors are measured against this scale instead."""
    big = float(np.max(np.abs(np.asarray(v, np.float64))))
    if s0 is not None:
        big = max(big, float(np.max(np.abs(np.asarray(s0, np.float64)))))
    return big * dk**-0.5
