"""Token selection: greedy, and temperature / top-k / top-p sampling applied identically everywhere.

``temperature``, ``top_k``, ``top_p`` are static Python numbers (they pick the compiled program);
keys are derived per step with ``fold_in`` so a seed reproduces a run.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp


def check_sampling_args(temperature, top_k, top_p) -> None:
    if isinstance(temperature, bool) or not isinstance(temperature, int | float):
        raise TypeError(f"temperature must be a number, got {type(temperature).__name__}")
    if not temperature >= 0.0 or temperature == float("inf"):
        raise ValueError(f"temperature must be finite and >= 0, got {temperature}")
    if isinstance(top_k, bool) or not isinstance(top_k, int) or top_k < 0:
        raise ValueError(f"top_k must be an int >= 0 (0 = off), got {top_k!r}")
    if isinstance(top_p, bool) or not isinstance(top_p, int | float) or not 0.0 < top_p <= 1.0:
        raise ValueError(f"top_p must be in (0, 1], got {top_p!r}")


def filtered_log_probs(logits: jax.Array, temperature: float, top_k: int, top_p: float):
    """Log-probabilities [..., V] of the sampling distribution (−inf outside top-k / top-p)."""
    x = logits.astype(jnp.float32) / temperature
    if top_k and top_k < x.shape[-1]:
        kth = jax.lax.top_k(x, top_k)[0][..., -1:]
        x = jnp.where(x >= kth, x, -jnp.inf)
    if top_p < 1.0:
        sorted_x = jnp.sort(x, axis=-1)[..., ::-1]
        probs = jax.nn.softmax(sorted_x, axis=-1)
        before = jnp.cumsum(probs, axis=-1) - probs  # mass strictly above each candidate
        keep_sorted = before < top_p  # always keeps the top one
        threshold = jnp.min(jnp.where(keep_sorted, sorted_x, jnp.inf), axis=-1, keepdims=True)
        x = jnp.where(x >= threshold, x, -jnp.inf)
    return jax.nn.log_softmax(x, axis=-1)


def select_tokens(logits: jax.Array, key, temperature: float, top_k: int, top_p: float):
    """Greedy (temperature 0) or sampled ids [...] from logits [..., V]."""
    if temperature == 0.0:
        return jnp.argmax(logits, axis=-1).astype(jnp.int32)
    logp = filtered_log_probs(logits, temperature, top_k, top_p)
    return jax.random.categorical(key, logp, axis=-1).astype(jnp.int32)
