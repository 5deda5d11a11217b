"""Public entry point for the gated delta rule: validation, method choice, dispatch.

    o, final_state = gated_delta_rule(q, k, v, g, beta, initial_state=None, scale=None,
                                      method="auto")
    q, k [b, t, hk, k]; v [b, t, hv, v]; g, beta [b, t, hv]; initial/final state [b, hv, k, v] f32.

Value head i reads key head i // (hv // hk), as HF's ``repeat_interleave``. No q/k normalisation
happens here (the layer does it). Inputs may be bf16; math and state are float32; ``o`` comes
back in q's dtype. An explicitly named method runs or raises, never falls back; ``"auto"`` picks by
shape and platform (``resolve_gdn_method``) and logs its choice once per shape.

``"ffi"`` (``mtpspec/kernels/cpu_gdn.cc``) is the recurrence as one native call per layer on CPU,
for decoding windows (no gradient); ``"auto"`` picks it only where decoding asks for it
(``gdn_method_for(..., native=True)``), never for training. Where it cannot run (not built, not
CPU, under a mesh) an explicit ``"ffi"`` raises OSError / ValueError before any device work.

``"pallas"`` (``pallas_gpu.py``) is compiled through Triton on GPU and runs with
``interpret=True`` on CPU; anything it cannot run (dtype, key dim, chunk size, platform) raises a
ValueError naming it, before any device work.
"""

from __future__ import annotations

import functools
import logging
import math

import jax
import jax.numpy as jnp

from mtpspec import compiled
from mtpspec.kernels import cpu_gdn
from mtpspec.ops.gdn.assoc import assoc
from mtpspec.ops.gdn.chunk import chunked
from mtpspec.ops.gdn.common import GDNAux, expand_key_heads, state_after
from mtpspec.ops.gdn.pallas_gpu import (
    PALLAS_DEFAULT_CHUNK,
    PallasConfig,
    effective_chunk,
    gdn_pallas,
    pallas_unsupported_reason,
)
from mtpspec.ops.gdn.reference import recurrent

logger = logging.getLogger("mtpspec.ops")

GDN_METHODS = ("auto", "recurrent", "chunk", "assoc", "pallas", "ffi")
# Decoding windows and prefills of up to FFI_MAX_T tokens run the native kernel ("ffi") under
# "auto" on CPU when it is built and one head's state (k·v floats) is at most FFI_MAX_HEAD_STATE:
# the kernel walks S token by token; at 64×64 heads it took 0.42-0.65 of the chunked form's time
# at every t from 16 to 2048, and at Qwen3.5's 128×128 heads (16 of them) 0.39-0.47 at t = 1, 2,
# 4, 6, 64 and 512 (`python -m experiments.bench_gdn --methods=chunk,ffi --key_heads=16
# --value_heads=16 --lengths=1,2,4,6,64,512`, BUILD_NOTES.md 2026-12-05).
FFI_MAX_T = 2048
FFI_MAX_HEAD_STATE = 128 * 128
# Default chunk length per platform: 64 as in fla/HF on GPU; on CPU 32 measured fastest at
# realistic heads (`python -m experiments.bench_gdn --chunk_size=...`, BUILD_NOTES.md).
DEFAULT_CHUNK_SIZE = {"cpu": 32}
DEFAULT_CHUNK_SIZE_OTHER = 64

# Lengths up to this use the plain recurrence under "auto"; longer ones the chunked form. On CPU
# at realistic heads the chunked form (chunk = min(32, t)) already wins from t = 2
# (`python -m experiments.bench_gdn`, BUILD_NOTES.md); "assoc" never wins there (k³ per combine).
AUTO_RECURRENT_MAX_T = 1
# Log-decays below this are clamped to it: exp(−200) is exactly 0 in float32 (and bfloat16), so a
# −inf gate (a full reset) means the same in every form without NaN from −inf − (−inf).
G_FLOOR = -200.0
# CPU exceptions, measured on 2026-12-01 (BUILD_NOTES.md): a single token runs the chunked form
# (faster than the one-step scan at realistic and at tiny heads), and small per-head states
# (k·v <= CPU_SMALL_STATE, e.g. the default model's 32 × 32) run the recurrence for verify windows
# of 2..CPU_SMALL_STATE_RECURRENT_MAX_T tokens, where it beat the chunked form.
CPU_SMALL_STATE = 32 * 32
CPU_SMALL_STATE_RECURRENT_MAX_T = 5
# Platforms on which "auto" runs the Pallas kernel (compiled, not interpreted). Empty until a
# recorded GPU check (`experiments/gpu_check.sh`, BUILD_NOTES.md "GPU") has passed on real
# hardware: the kernel has only run in interpret mode so far. Flipping it is this one line:
# AUTO_PALLAS_PLATFORMS = ("gpu",)
AUTO_PALLAS_PLATFORMS: tuple[str, ...] = ()


def resolve_gdn_method(
    t: int,
    platform: str | None = None,
    *,
    pallas_ok: bool = True,
    head_state: int | None = None,
) -> str:
    """What ``method="auto"`` runs for a sequence of ``t`` positions on ``platform``
    (``head_state``: elements of one head's state, k·v, when known).

    A single token (a decode step) runs the recurrence, except on CPU, where the chunked form
    measured faster. Longer sequences (verification windows, prefill, training) run the chunked
    form, which measured faster from t = 2 on CPU at realistic heads; on CPU with small heads
    (``head_state <= CPU_SMALL_STATE``) windows of up to ``CPU_SMALL_STATE_RECURRENT_MAX_T``
    tokens run the recurrence; on a platform in ``AUTO_PALLAS_PLATFORMS`` (none until a GPU check
    has passed) the Pallas kernel when it supports the call (``pallas_ok``: dtype, key dim). On
    CPU Pallas would only run interpreted, so "auto" never picks it there.
    """
    platform = platform or jax.default_backend()
    if platform == "cpu":
        if t == 1:
            return "chunk"
        small = head_state is not None and head_state <= CPU_SMALL_STATE
        if small and t <= CPU_SMALL_STATE_RECURRENT_MAX_T:
            return "recurrent"
    if t <= AUTO_RECURRENT_MAX_T:
        return "recurrent"
    if platform in AUTO_PALLAS_PLATFORMS and pallas_ok:
        return "pallas"
    return "chunk"


def gdn_method_for(
    method: str,
    t: int,
    *,
    sharded: bool = False,
    native: bool = False,
    head_state: int | None = None,
) -> str:
    """The GDN method a model should be run with for ``t`` positions (host side, before tracing).

    Validates the name. ``native``: the caller decodes (no gradient needed), so ``"auto"`` may
    pick the C++ kernel ("ffi") on CPU for ``t <= FFI_MAX_T`` (decode steps, verify windows and
    prefills) and ``head_state`` (k·v of one head) ``<= FFI_MAX_HEAD_STATE`` when it is built
    and not under a mesh (logged); an explicit ``"ffi"`` raises where it cannot run. Otherwise,
    without a mesh, the name is returned as is (``"auto"`` resolves per call, with the call's
    dtypes). Under a device mesh
    (``sharded=True``) ``pallas_call`` and the FFI kernel have no GSPMD partitioning rule (a
    ``shard_map`` wrapper is not written yet): an explicit ``"pallas"`` or ``"ffi"`` is refused
    and ``"auto"`` is resolved here to a form that partitions (logged)."""
    if method not in GDN_METHODS:
        raise ValueError(f"unknown GDN method {method!r}; expected one of {GDN_METHODS}")
    if method == "ffi":
        _check_ffi(sharded)
    small = head_state is not None and head_state <= FFI_MAX_HEAD_STATE
    if method == "auto" and native and small and not sharded and t <= FFI_MAX_T:
        platform = jax.default_backend()
        if platform == "cpu" and cpu_gdn.available():
            _log_auto_choice(t, f"{platform} (decoding)", "ffi")
            return "ffi"
    if not sharded:
        return method
    if method == "pallas":
        raise ValueError(
            "GDN method 'pallas' cannot run under a device mesh (the Pallas kernel is not "
            "partitioned); use 'auto' or 'chunk'"
        )
    if method == "auto":
        platform = jax.default_backend()
        method = resolve_gdn_method(t, platform, pallas_ok=False)
        _log_auto_choice(t, f"{platform} under a mesh", method)
    return method


def _check_ffi(sharded: bool = False) -> None:
    if sharded:
        raise ValueError(
            "GDN method 'ffi' cannot run under a device mesh (the C++ kernel is not "
            "partitioned); use 'auto' or 'chunk'"
        )
    if jax.default_backend() != "cpu":
        raise ValueError(
            f"GDN method 'ffi' is a CPU kernel; the default backend is {jax.default_backend()!r}"
        )
    cpu_gdn.require()


@functools.lru_cache(maxsize=256)
def _log_auto_choice(t: int, platform: str, method: str) -> None:
    logger.info("gated_delta_rule(method='auto'): t=%d on %s -> %r", t, platform, method)


def _check_inputs(q, k, v, g, beta, initial_state, scale, method, chunk_size):
    if method not in GDN_METHODS:
        raise ValueError(
            f"unknown gated_delta_rule method {method!r}; expected one of {GDN_METHODS}"
        )
    named = {"q": q, "k": k, "v": v, "g": g, "beta": beta}
    for name, x in named.items():
        if not hasattr(x, "shape") or not hasattr(x, "dtype"):
            raise TypeError(f"{name} must be an array, got {type(x).__name__}")
        if not jnp.issubdtype(x.dtype, jnp.floating):
            raise TypeError(f"{name} must be floating point, got dtype {x.dtype}")
    for name, rank in (("q", 4), ("k", 4), ("v", 4), ("g", 3), ("beta", 3)):
        if named[name].ndim != rank:
            raise ValueError(f"{name} must have rank {rank}, got shape {named[name].shape}")
    if q.shape != k.shape:
        raise ValueError(f"q and k shapes differ: q {q.shape}, k {k.shape}")
    b, t, hk, dk = k.shape
    bv, tv, hv, dv = v.shape
    if (bv, tv) != (b, t):
        raise ValueError(f"v batch/time {v.shape[:2]} do not match q/k {(b, t)}")
    if t == 0:
        raise ValueError("sequence length must be at least 1, got t=0")
    if hv % hk:
        raise ValueError(f"value heads ({hv}) must be a multiple of key heads ({hk})")
    for name in ("g", "beta"):
        if named[name].shape != (b, t, hv):
            raise ValueError(f"{name} must have shape {(b, t, hv)}, got {named[name].shape}")
    if initial_state is not None:
        if not hasattr(initial_state, "shape"):
            raise TypeError(f"initial_state must be an array, got {type(initial_state).__name__}")
        if tuple(initial_state.shape) != (b, hv, dk, dv):
            raise ValueError(
                f"initial_state must have shape {(b, hv, dk, dv)}, got {initial_state.shape}"
            )
    if scale is not None and not (isinstance(scale, int | float) and math.isfinite(scale)):
        raise ValueError(f"scale must be a finite Python number, got {scale!r}")
    if chunk_size is not None and (
        not isinstance(chunk_size, int) or isinstance(chunk_size, bool) or chunk_size < 1
    ):
        raise ValueError(f"chunk_size must be a positive int, got {chunk_size!r}")
    if method == "pallas":
        reason = _pallas_reason(q, k, v, chunk_size, jax.default_backend())
        if reason is not None:
            raise ValueError(reason)
    if method == "ffi":
        _check_ffi()


def _pallas_reason(q, k, v, chunk_size, platform):
    dtypes = {"q": q.dtype, "k": k.dtype, "v": v.dtype}
    return pallas_unsupported_reason(dtypes, k.shape[-1], chunk_size, platform)


@functools.partial(
    compiled.jit, static_argnames=("method", "scale", "return_states", "chunk_size", "platform")
)
def _run(q, k, v, g, beta, initial_state, *, method, scale, return_states, chunk_size, platform):
    hv = v.shape[2]
    f32 = jnp.float32
    if method == "pallas":  # takes key heads unexpanded and inputs in their own dtype
        cfg = PallasConfig(
            scale=scale,
            chunk=effective_chunk(q.shape[1], chunk_size),
            return_states=return_states,
            interpret=platform == "cpu",  # static: part of the jit cache key
        )

        def pallas_form(q, k, v, g, beta):
            o, final, u, states = gdn_pallas(q, k, v, g, beta, initial_state.astype(f32), cfg)
            return o, final, GDNAux(u=u, g_cum=jnp.cumsum(g.astype(f32), axis=1), states=states)

        return _causal_non_finite(pallas_form, q, k, v, g, beta)
    if method == "ffi":  # key heads unexpanded; the kernel reads head h // (hv // hk)
        o, final, u, states = cpu_gdn.apply(q, k, v, g, beta, initial_state, scale, return_states)
        return o, final, GDNAux(u=u, g_cum=jnp.cumsum(g.astype(f32), axis=1), states=states)
    q, k = (expand_key_heads(x.astype(f32), hv) for x in (q, k))
    args = (q, k, v.astype(f32), g.astype(f32), beta.astype(f32), initial_state.astype(f32))
    if method == "recurrent":
        return recurrent(*args, scale, return_states)
    if method == "chunk":
        return _causal_non_finite(
            lambda *x: chunked(*x, args[5], scale, return_states, chunk_size), *args[:5]
        )
    if method == "assoc":
        return assoc(*args, scale, return_states)
    raise AssertionError(method)


def _causal_non_finite(form, q, k, v, g, beta):
    """Run a chunked form (``form(q, k, v, g, beta) -> (o, final, aux)``) so that a NaN /
    infinity at position j reaches exactly what it reaches in the recurrence: in k, v, g or β,
    o / u / states from j on and the final state; in q, o_j alone. Inside a chunk the masked
    products would otherwise compute 0 · NaN = NaN for earlier positions too. Non-finite positions
    are zeroed (g = β = 0: no update) before the form runs and their reach restored after. q and
    k may hold fewer (key) heads than v (value head i reads key head i // r)."""
    r = v.shape[2] // k.shape[2]
    ok = lambda x: jnp.all(jnp.isfinite(x), axis=-1)  # noqa: E731 - per (b, t, head)
    to_value_heads = lambda m: jnp.repeat(m, r, axis=2) if r > 1 else m  # noqa: E731
    bad_q, bad_k = ~ok(q), ~ok(k)  # key heads
    bad_state = to_value_heads(bad_k) | ~ok(v) | ~jnp.isfinite(g) | ~jnp.isfinite(beta)
    zero = lambda x, bad: jnp.where(bad, 0.0, x)  # noqa: E731
    o, final, aux = form(
        zero(q, bad_q[..., None]),
        zero(k, bad_k[..., None]),
        zero(v, bad_state[..., None]),
        zero(g, bad_state),
        zero(beta, bad_state),
    )
    poisoned = jnp.cumsum(bad_state.astype(jnp.int32), axis=1) > 0  # [b, t, hv]
    nan = jnp.float32(jnp.nan)
    o = jnp.where((poisoned | to_value_heads(bad_q))[..., None], nan, o)
    final = jnp.where(jnp.any(poisoned, axis=1)[..., None, None], nan, final)
    states = aux.states
    if states is not None:
        states = jnp.where(poisoned[..., None, None], nan, states)
    u = jnp.where(poisoned[..., None], nan, aux.u)
    return o, final, GDNAux(u=u, g_cum=jnp.cumsum(g.astype(jnp.float32), axis=1), states=states)


def gated_delta_rule_with_aux(
    q: jax.Array,  # [b, t, hk, k]
    k: jax.Array,  # [b, t, hk, k]
    v: jax.Array,  # [b, t, hv, v]
    g: jax.Array,  # [b, t, hv] log-decay, <= 0
    beta: jax.Array,  # [b, t, hv] in (0, 1)
    *,
    initial_state: jax.Array | None = None,  # [b, hv, k, v]
    scale: float | None = None,
    method: str = "auto",
    chunk_size: int | None = None,
    return_states: bool = False,
) -> tuple[jax.Array, jax.Array, GDNAux]:
    """Like ``gated_delta_rule`` but also returns the commit data (``GDNAux``).

    With ``return_states=True`` the aux carries every per-position state [b, t, hv, k, v].
    """
    _check_inputs(q, k, v, g, beta, initial_state, scale, method, chunk_size)
    # g = −inf (full decay: the state is reset) is valid; every form sees it as G_FLOOR, whose
    # exp is exactly 0 in float32, so differences of cumulative gates stay finite (no −inf − −inf)
    g = jnp.maximum(g.astype(jnp.float32), G_FLOOR)
    b, t, _, dk = k.shape
    hv, dv = v.shape[2:]
    platform = jax.default_backend()
    if method == "auto":
        pallas_ok = _pallas_reason(q, k, v, chunk_size, platform) is None
        method = resolve_gdn_method(t, platform, pallas_ok=pallas_ok, head_state=dk * dv)
        _log_auto_choice(t, platform, method)
    if initial_state is None:
        initial_state = jnp.zeros((b, hv, dk, dv), jnp.float32)
    scale = float(dk**-0.5 if scale is None else scale)
    if chunk_size is None and method == "pallas":
        chunk_size = PALLAS_DEFAULT_CHUNK
    elif chunk_size is None:
        chunk_size = DEFAULT_CHUNK_SIZE.get(platform, DEFAULT_CHUNK_SIZE_OTHER)
    o, final, aux = _run(
        q,
        k,
        v,
        g,
        beta,
        initial_state,
        method=method,
        scale=scale,
        return_states=bool(return_states),
        chunk_size=min(chunk_size, t) if method == "chunk" else chunk_size,
        platform=platform,
    )
    return o.astype(q.dtype), final, aux


def gated_delta_rule(
    q: jax.Array,
    k: jax.Array,
    v: jax.Array,
    g: jax.Array,
    beta: jax.Array,
    *,
    initial_state: jax.Array | None = None,
    scale: float | None = None,
    method: str = "auto",
    chunk_size: int | None = None,
) -> tuple[jax.Array, jax.Array]:
    """The gated delta rule; returns (o [b, t, hv, v] in q's dtype, final state [b, hv, k, v] f32).

    method: "recurrent" (``lax.scan``, the reference), "chunk" (WY/UT form, ``chunk_size``; None
    picks the platform default: 32 on CPU, 64 elsewhere),
    "assoc" (associative scan), "auto" (see ``resolve_gdn_method``), "pallas" (the Pallas kernel:
    Triton on GPU, interpret mode on CPU; ``chunk_size`` in 16..128, a power of two, default 32;
    gradients via a custom_vjp over the chunked form). Bad shapes or method raise ValueError /
    TypeError; a call "pallas" cannot run raises ValueError naming why.
    """
    o, final, _ = gated_delta_rule_with_aux(
        q,
        k,
        v,
        g,
        beta,
        initial_state=initial_state,
        scale=scale,
        method=method,
        chunk_size=chunk_size,
    )
    return o, final


def commit_state(initial_state, k, aux: GDNAux, n, *, native: bool = False, final=None):
    """The state [b, h, k, v] float32 after the first ``n`` [b] positions of a verified window
    (the "replay" commit), from the window's keys expanded to value heads and its aux data.
    ``native``: the window ran the C++ kernel, and so does this — one call per layer
    (``kernels.cpu_gdn.commit``; windows of up to ``cpu_gdn.COMMIT_MAX_T`` positions, longer ones
    the closed form ``state_after``), taking ``final`` (the state the window ended in, when
    given) as is for rows that keep the whole window; it raises OSError where the kernel cannot
    run (an explicit choice runs or raises). Otherwise ``state_after``."""
    if native and k.shape[1] <= cpu_gdn.COMMIT_MAX_T:
        return cpu_gdn.commit(initial_state, k, aux.u, aux.g_cum, n, final=final)
    return state_after(initial_state, k, aux, n)
