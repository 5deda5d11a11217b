"""``argmax`` over a vocabulary: ``jnp.argmax(x, axis=-1)`` as int32, the same index.

XLA:CPU lowers ``jnp.argmax`` to a variadic (value, index) reduce that it does not vectorise:
~0.74 ms of a 58 ms real-size decode step over Qwen3.5's 248,320 logits. Over a long last axis
this takes the maximum (and whether any entry is NaN), then the first index that holds it, in
plain reductions (0.44 ms in that step; BUILD_NOTES.md): the lowest index among ties, and the
first NaN when there is one — ``jnp.argmax``'s answers.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp

# Below this many entries on the last axis the variadic reduce is as fast (and one op).
TWO_PASS_FROM = 4096


def argmax(x: jax.Array) -> jax.Array:
    """The index [...] int32 of the largest entry of ``x`` [..., n] along its last axis (the
    lowest among ties; the first NaN if any), as ``jnp.argmax(x, axis=-1)``."""
    n = x.shape[-1]
    if n < TWO_PASS_FROM:
        return jnp.argmax(x, axis=-1).astype(jnp.int32)
    m = jnp.max(x, axis=-1, keepdims=True)  # XLA:CPU's vector max may skip a NaN
    nan = jnp.isnan(x)
    hit = jnp.where(jnp.any(nan, axis=-1, keepdims=True), nan, x == m)
    iota = jax.lax.broadcasted_iota(jnp.int32, x.shape, x.ndim - 1)
    return jnp.min(jnp.where(hit, iota, n), axis=-1)
