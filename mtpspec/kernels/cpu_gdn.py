"""The gated delta rule over a short window on CPU (``cpu_gdn.cc``), registered as an XLA FFI
target: one native call per GDN layer for a decode step or a verify window.

    ok, why = status()
    o, final, u, states = apply(q, k, v, g, beta, state0, scale, return_states)
    state_n = commit(state0, k, u, g_cum, n, final)   # the "replay" commit, natively

q, k [b, t, hk, dk] (key heads not expanded: value head h reads key head h // (hv // hk)),
v [b, t, hv, dv], g (log-decay, already clamped to ``G_FLOOR``) and beta [b, t, hv], state0
[b, hv, dk, dv]; all float32. Returns o and u [b, t, hv, dv], the final state and, with
``return_states``, every per-position state [b, t, hv, dk, dv] (else None). Heads are shared
between the caller and helper threads of XLA's pool (``gdn_threads``); a token's arithmetic is
the same whatever the window length, the thread or the instruction set (both from
``kernels.settings``, read when a call is traced: AVX-512 or AVX2 loops that hold a head's value
row in registers, for value widths of 8-128 in whole vectors). No gradient: decoding only.

``apply_tree`` is a tree window (speculative tree verification): node r advances from its
parent's state (``parent[r]``; −1 for the root, which continues ``state0``), nodes breadth
first; returns o and u [b, R, hv, dv] and every node's state [b, R, hv, dk, dv].

``commit`` is the "replay" commit (``ops.state_after``) of a verified window: the state after its
first ``n`` [b] positions, S_n = e^{G_n} S_0 + Σ_{i<n} e^{G_n − G_i} k_i u_iᵀ, from k expanded to
value heads [b, t, hv, dk], u [b, t, hv, dv] and the cumulative log-decays G [b, t, hv]
(``GDNAux``); windows of up to ``COMMIT_MAX_T`` positions. Given ``final``, the state the window
ended in [b, hv, dk, dv], a row with n = t takes it as is (the recurrence's own state, no
arithmetic).
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np

from mtpspec.kernels import library, settings
from mtpspec.ops.conv import check_counts

TARGET = "mtpspec_cpu_gdn"
COMMIT_TARGET = "mtpspec_cpu_gdn_commit"
# The committed state takes the pre-window state's buffer (each output row reads only its own row
# of state0, before writing it): in the decode loop the new state then lands in the loop-carried
# buffer instead of being copied there every step (XLA copies state0 first where it is still
# needed). Read when a call is traced.
COMMIT_ALIASES = {0: 0}
TREE_TARGET = "mtpspec_cpu_gdn_tree"
COMMIT_MAX_T = 64  # window positions the native commit takes (its per-position weights' buffer)


KERNEL = library.Target(TARGET, "MtpspecCpuGdn", "GDN method 'ffi' needs the C++ CPU kernels")
available, require = KERNEL.available, KERNEL.require  # both ask KERNEL.status()
TREE_KERNEL = library.Target(
    TREE_TARGET, "MtpspecCpuGdnTree", "the native GDN tree window needs the C++ CPU kernels"
)
COMMIT_KERNEL = library.Target(
    COMMIT_TARGET, "MtpspecCpuGdnCommit", "the native replay commit needs the C++ CPU kernels"
)


def status() -> tuple[bool, str]:
    return KERNEL.status()


def apply(q, k, v, g, beta, state0, scale: float, return_states: bool):
    require()  # registers the FFI target on first use (cached)
    b, t, _, dk = q.shape
    hv, dv = v.shape[2:]
    f32 = jnp.float32
    out = jax.ShapeDtypeStruct((b, t, hv, dv), f32)
    states = jax.ShapeDtypeStruct((b, t, hv, dk, dv) if return_states else (0,), f32)
    final = jax.ShapeDtypeStruct((b, hv, dk, dv), f32)
    o, fin, u, st = jax.ffi.ffi_call(TARGET, (out, final, out, states))(
        *(x.astype(f32) for x in (q, k, v, g, beta, state0)),
        scale=np.float32(scale),
        **settings.current().attributes("gdn"),
    )
    return o, fin, u, st if return_states else None


def commit(state0, k, u, g_cum, n, final=None) -> jax.Array:
    """The state [b, h, dk, dv] float32 after the first ``n`` [b] (clamped to 0..t) positions of a
    verified window; with ``final`` (the state after all t), rows with n = t return it (see the
    module docstring)."""
    b, t = k.shape[:2]
    if t > COMMIT_MAX_T:
        raise ValueError(f"the native GDN commit takes windows of up to {COMMIT_MAX_T}, got {t}")
    check_counts(n, b, t)  # concrete counts outside 0..t: ValueError (as ops.state_after)
    COMMIT_KERNEL.require()
    f32 = jnp.float32
    if final is not None and final.shape != state0.shape:
        raise ValueError(f"final {final.shape} must have the state's shape {state0.shape}")
    final = jnp.zeros((0,), f32) if final is None else final
    out = jax.ShapeDtypeStruct(state0.shape, f32)
    return jax.ffi.ffi_call(COMMIT_TARGET, out, input_output_aliases=COMMIT_ALIASES)(
        *(x.astype(f32) for x in (state0, k, u, g_cum)),
        n.astype(jnp.int32),
        final.astype(f32),
    )


def apply_tree(q, k, v, g, beta, state0, parent, scale: float):
    """A tree window's gated delta rule (see the module docstring): (o, u, states)."""
    TREE_KERNEL.require()
    b, t, _, dk = q.shape
    hv, dv = v.shape[2:]
    f32 = jnp.float32
    out = jax.ShapeDtypeStruct((b, t, hv, dv), f32)
    states = jax.ShapeDtypeStruct((b, t, hv, dk, dv), f32)
    return jax.ffi.ffi_call(TREE_TARGET, (out, out, states))(
        *(x.astype(f32) for x in (q, k, v, g, beta, state0)),
        jnp.asarray(parent, jnp.int32),
        scale=np.float32(scale),
        **settings.current().attributes("gdn"),
    )
