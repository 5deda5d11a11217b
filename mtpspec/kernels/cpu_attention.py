"""Causal grouped-query attention of a decode step or short verify window over its KV cache on CPU
(``cpu_attention.cc``), registered as an XLA FFI target: one native call per attention layer.

    ok, why = status()
    o = apply(q, k_cache, v_cache, positions, scale)

q [b, t, hq, d]; the cache as the decode state keeps it, k [b, g, n, d] and v transposed
[b, g, d, n], already holding the window's own keys; positions [b, t] int32: query i reads slots
0..positions[i] (only the live prefix, not the whole capacity). Returns o [b, t, hq, d] float32.
The query rows of one kv head go through the cache together, one row per vector lane (16 with
AVX-512, 8 with AVX2: ``kernels.settings`` sets the instruction set of every CPU kernel); a row's
arithmetic depends neither on the window length, its lane neighbours, the instruction set nor the
thread, so a window's rows are bit for bit the steps'. Groups of rows are shared between the caller
and helper threads of XLA's pool (``attention_threads``). No gradient: decoding only.
``models.layers.attention`` uses it where decoding's ``attention`` option resolved to "ffi", for
windows of up to ``MAX_T`` tokens: decode steps, verify windows and prefills of up to 2048 tokens
(bucketed prompt length); longer prefills use XLA's form. Each query walks its live prefix, so
the cost grows as t², as XLA's form's does. Against the earlier one-row-at-a-time kernel (dot
products with a horizontal sum per score and per output) the lanes took 0.2-0.5 of the time with
the cache warm at the default model's heads (1-7 query tokens, a 160-token prefill); in the
decode loop, where the cache comes cold after the weights, an MTP k = 3 run took 5 % less time
and plain decoding the same (BUILD_NOTES.md has the runs).
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np

from mtpspec.kernels import library, settings

TARGET = "mtpspec_cpu_attention"
MAX_T = 2048  # window tokens up to which decoding uses the kernel

KERNEL = library.Target(
    TARGET, "MtpspecCpuAttention", "the native attention needs the C++ CPU kernels"
)
TREE_TARGET = "mtpspec_cpu_tree_attention"
TREE_KERNEL = library.Target(
    TREE_TARGET, "MtpspecCpuTreeAttention", "the native tree attention needs the C++ CPU kernels"
)
available, require = KERNEL.available, KERNEL.require


def status() -> tuple[bool, str]:
    return KERNEL.status()


def apply(q, k_cache, v_cache, positions, scale: float) -> jax.Array:
    return _call(KERNEL, TARGET, q, k_cache, v_cache, (positions,), scale)


def apply_tree(q, k_cache, v_cache, lengths, ancestors, scale: float) -> jax.Array:
    """A tree window's attention: q [b, R, hq, d] (row r at its own position), the cache already
    holding row r's key at slot lengths + r; row r reads slots 0 .. lengths - 1 (the committed
    prefix) and lengths + a for every a with ``ancestors[r, a]`` (its path: ancestors and
    itself; [R, R] bool or int). Returns o [b, R, hq, d] float32."""
    return _call(TREE_KERNEL, TREE_TARGET, q, k_cache, v_cache, (lengths, ancestors), scale)


def _call(kernel, target, q, k_cache, v_cache, ints, scale):
    """One attention FFI call: q and the cache as float32, ``ints`` (positions; or lengths and
    the ancestor mask) as int32, then the scale and the thread count."""
    kernel.require()  # registers the FFI target on first use (cached)
    out = jax.ShapeDtypeStruct(q.shape, jnp.float32)
    f32 = jnp.float32
    return jax.ffi.ffi_call(target, out)(
        q.astype(f32),
        k_cache.astype(f32),
        v_cache.astype(f32),
        *(jnp.asarray(x).astype(jnp.int32) for x in ints),
        scale=np.float32(scale),
        **settings.current().attributes("attention"),
    )
