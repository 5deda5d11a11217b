"""Causal grouped-query attention of a decode step or short verify window over its KV cache on CPU
(``cpu_attention.cc``), registered as an XLA FFI target: one native call per attention layer.

    ok, why = status()
    o = apply(q, k_cache, v_cache, positions, scale)

q [b, t, hq, d]; the cache as the decode state keeps it, k [b, g, n, d] and v transposed
[b, g, d, n], already holding the window's own keys; positions [b, t] int32: query i reads slots
0..positions[i] (only the live prefix, not the whole capacity). Returns o [b, t, hq, d] float32.
Single-threaded; a row's arithmetic does not depend on the window length. No gradient: decoding
only — ``models.layers.attention`` uses it where decoding's ``attention`` option resolved to
"ffi", for windows of up to ``MAX_T`` tokens: decode steps, verify windows of k + 1 ≤ 16 (beyond,
the window uses XLA's form while steps use the kernel, so the two no longer share arithmetic),
and the prefill of a prompt of at most 16 tokens (one bucket); longer prefills use XLA's form.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np

from mtpspec.kernels import library

TARGET = "mtpspec_cpu_attention"
MAX_T = 16  # window tokens up to which decoding uses the kernel (as ops.gdn.api.FFI_MAX_T)

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
