"""Causal grouped-query attention of a decode step or short verify window over its KV cache on CPU
(``cpu_attention.cc``), registered as an XLA FFI target: one native call per attention layer.

    ok, why = status()
    o = apply(q, k_cache, v_cache, positions, scale)

q [b, t, hq, d]; the cache as the decode state keeps it, k [b, g, n, d] and v transposed
[b, g, d, n], already holding the window's own keys; positions [b, t] int32: query i reads slots
0..positions[i] (only the live prefix, not the whole capacity). Returns o [b, t, hq, d] float32.
Single-threaded; a row's arithmetic does not depend on the window length. No gradient: decoding
only — ``models.layers.attention`` uses it where decoding's ``attention`` option resolved to
"ffi", for windows of up to ``MAX_T`` tokens: decode steps, verify windows and prefills of up to
320 tokens (bucketed prompt length); longer prefills use XLA's form. The kernel walks each
query's live prefix on one thread, so its cost grows as t²: at the default model's attention
shape it took 0.71-0.90 of XLA's time at t = 160-320 and 1.10 at 384 (BUILD_NOTES.md, fifth
session).
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np

from mtpspec.kernels import library

TARGET = "mtpspec_cpu_attention"
MAX_T = 320  # window tokens up to which decoding uses the kernel

KERNEL = library.Target(
    TARGET, "MtpspecCpuAttention", "the native attention needs the C++ CPU kernels"
)
available, require = KERNEL.available, KERNEL.require


def status() -> tuple[bool, str]:
    return KERNEL.status()


def apply(q, k_cache, v_cache, positions, scale: float) -> jax.Array:
    require()  # registers the FFI target on first use (cached)
    out = jax.ShapeDtypeStruct(q.shape, jnp.float32)
    f32 = jnp.float32
    return jax.ffi.ffi_call(TARGET, out)(
        q.astype(f32),
        k_cache.astype(f32),
        v_cache.astype(f32),
        positions.astype(jnp.int32),
        scale=np.float32(scale),
    )
