"""Pallas kernel for the chunked gated delta rule (prefill) and the verify window (t <= 16).

One program per (batch, value head, block of value columns); inside it a sequential loop over
chunks carries the float32 state S [k, block_v] in registers. Per chunk of C positions (G the
chunk-local cumulative gate, computed by the wrapper):

    L    = e^{G_i − G_j} for i ≥ j, else 0       (difference masked with ``where`` before ``exp``)
    A    = strict_tril(diag(β) K Kᵀ ⊙ L)
    T    = (I + A)⁻¹                              (row-by-row forward substitution, in registers)
    U    = T (β V),   W = T (β K ⊙ e^G)
    V'   = U − W S                                (the u_t of the recurrence: commit data)
    O    = scale · [(Q ⊙ e^G) S + tril(Q Kᵀ ⊙ L) V']
    S'   = e^{G_C} S + (K ⊙ e^{G_C − G})ᵀ V'
    S_i  = e^{G_i} S + Σ_{j≤i} L_ij k_j u_jᵀ       (only with return_states: per-position states)

Columns of S are independent in every equation above (T and W depend on k, β, g only), which is
why value columns can be split across programs: each recomputes the small C×C solve.

Why these choices (docs/decisions.md, "Pallas kernel", has the long form):
- Lowering: Triton (``compiler_params=pallas.triton.CompilerParams``), chosen explicitly. Its
  ``dot`` honours ``Precision.HIGHEST`` as IEEE float32 (the forms must agree to 1e-5; TF32 would
  not), and it lowers plain ``jnp`` ops on register tiles, which is what this kernel is made of.
  Mosaic GPU (the default GPU lowering from JAX 0.10) has no ``dot_general`` lowering — matrix
  products go through ``plgpu.wgmma`` on shared-memory refs with explicit copies and barriers, in
  TF32 for float32 operands — and none of that can be exercised without a GPU.
- Triton wants every tile a power of two and every ``dot`` operand at least 16×16: key/value dims
  are zero-padded to powers of two ≥ 16, t to whole chunks (C a power of two in 16..128). Zero
  padding is exact: a padded position has g = 0, β = 0, k = v = 0, so it neither decays nor
  updates the state, and padded key/value columns stay zero; the wrapper slices them off.
- No sub-tile slicing of register values (Triton cannot): rows are extracted with masked sums.
- Key heads are not repeated: the q/k block index map reads key head h // r directly.

Gradients: ``gdn_pallas`` is a ``jax.custom_vjp`` whose backward differentiates the chunked XLA
form (``chunk.chunked``) at the same inputs, so training never differentiates ``pallas_call``.
On CPU the same kernel runs with ``interpret=True``.
"""

from __future__ import annotations

import functools
from typing import NamedTuple

import jax
import jax.numpy as jnp
from jax.experimental import pallas as pl

from mtpspec.ops.gdn.chunk import chunked
from mtpspec.ops.gdn.common import HIGHEST, expand_key_heads

PALLAS_DTYPES = (jnp.dtype(jnp.float32), jnp.dtype(jnp.bfloat16))
PALLAS_MAX_KEY_DIM = 256  # the state tile [k, block_v] f32 lives in registers
PALLAS_BLOCK_V = 64  # value columns per program (the grid's third axis covers the rest)
# Triton warps per program: 8 spilled far less than 4 when compiled offline for sm_90
# (`experiments/investigations/triton_offline.py`, BUILD_NOTES.md); not timed on a GPU yet.
PALLAS_NUM_WARPS = 8
PALLAS_MIN_TILE = 16  # Triton's smallest dot operand dimension
PALLAS_CHUNK_SIZES = (16, 32, 64, 128)
# Default chunk on GPU: 32 keeps the C×C tiles (L, A, T, QKᵀ) and the serial C-step solve small;
# not measured on a GPU yet (`experiments/gpu_check.py --sweep=...` times the choices).
PALLAS_DEFAULT_CHUNK = 32
VERIFY_MAX_T = 16  # t <= 16: one chunk of 16, the verify-window specialisation
PALLAS_PLATFORMS = ("cpu", "gpu")  # gpu: compiled through Triton; cpu: interpret=True


def _next_pow2(n: int) -> int:
    return 1 << max(0, (n - 1).bit_length())


def padded_dim(d: int) -> int:
    """Key/value dims are padded to a power of two, at least Triton's 16."""
    return max(PALLAS_MIN_TILE, _next_pow2(d))


def effective_chunk(t: int, chunk_size: int) -> int:
    """Chunk the kernel runs for ``t`` positions: one chunk of 16 for a verify window (t <= 16),
    else ``chunk_size`` but no longer than t rounded up to a power of two."""
    if t <= VERIFY_MAX_T:
        return VERIFY_MAX_T
    return max(PALLAS_MIN_TILE, min(chunk_size, _next_pow2(t)))


def pallas_unsupported_reason(
    dtypes, key_dim: int, chunk_size: int | None, platform: str
) -> str | None:
    """Why ``method="pallas"`` cannot run this call, or None. Checked before any device work."""
    if platform not in PALLAS_PLATFORMS:
        return (
            f"gated_delta_rule(method='pallas') runs on GPU (Triton lowering) or on CPU "
            f"(interpret mode), not on platform {platform!r}"
        )
    for name, dtype in dtypes.items():
        if jnp.dtype(dtype) not in PALLAS_DTYPES:
            return (
                f"gated_delta_rule(method='pallas') takes float32 or bfloat16 {name}, "
                f"got dtype {jnp.dtype(dtype).name}"
            )
    if key_dim > PALLAS_MAX_KEY_DIM:
        return (
            f"gated_delta_rule(method='pallas') supports key_dim <= {PALLAS_MAX_KEY_DIM} "
            f"(the state tile lives in registers), got key_dim={key_dim}"
        )
    if chunk_size is not None and chunk_size not in PALLAS_CHUNK_SIZES:
        return (
            f"gated_delta_rule(method='pallas') needs chunk_size in {PALLAS_CHUNK_SIZES} "
            f"(a power of two: Triton tiles), got chunk_size={chunk_size}"
        )
    return None


class PallasConfig(NamedTuple):
    """Static settings of one kernel build (hashable: a ``nondiff_argnums`` of the custom_vjp)."""

    scale: float
    chunk: int  # effective chunk (see ``effective_chunk``)
    return_states: bool
    interpret: bool
    block_v: int = PALLAS_BLOCK_V
    num_warps: int = PALLAS_NUM_WARPS


# ---- the kernel ----------------------------------------------------------------------------


def _dot(a, b):  # [m, k] @ [k, n], exact float32 (Triton: IEEE, not TF32)
    return jax.lax.dot(a, b, precision=HIGHEST, preferred_element_type=jnp.float32)


def _dot_nt(a, b):  # a @ bᵀ: [m, k], [n, k] -> [m, n]
    dims = (((1,), (1,)), ((), ()))
    return jax.lax.dot_general(a, b, dims, precision=HIGHEST, preferred_element_type=jnp.float32)


def _dot_tn(a, b):  # aᵀ @ b: [c, m], [c, n] -> [m, n]
    dims = (((0,), (0,)), ((), ()))
    return jax.lax.dot_general(a, b, dims, precision=HIGHEST, preferred_element_type=jnp.float32)


def _strict_lower(rows, cols):
    """Mask of A's support (j < i). Module-level so the negative-control test can corrupt it."""
    return rows > cols


def _gdn_kernel(
    q_ref,  # [tp, kp] (key head h // r)
    k_ref,  # [tp, kp]
    v_ref,  # [tp, bv]
    gc_ref,  # [tp] f32, chunk-local cumulative gate G
    beta_ref,  # [tp] f32
    s0_ref,  # [kp, bv] f32
    o_ref,  # [tp, bv] f32
    u_ref,  # [tp, bv] f32
    final_ref,  # [kp, bv] f32
    *states_ref,  # ([tp, kp, bv] f32,) with return_states
    cfg: PallasConfig,
    n_chunks: int,
):
    f32 = jnp.float32
    c = cfg.chunk
    rows = jax.lax.broadcasted_iota(jnp.int32, (c, c), 0)
    cols = jax.lax.broadcasted_iota(jnp.int32, (c, c), 1)
    incl = rows >= cols
    strict = _strict_lower(rows, cols)
    eye = jnp.where(rows == cols, 1.0, 0.0).astype(f32)
    pos = jax.lax.broadcasted_iota(jnp.int32, (c,), 0)

    def chunk_step(ci, state):  # state [kp, bv] f32, entering chunk ci
        # ---- PREPARATION: load one chunk, cast to float32 -------------------------------------
        start = pl.multiple_of(ci * c, c)
        rows_c = pl.ds(start, c)
        q = q_ref[rows_c, :].astype(f32)  # [c, kp]
        k = k_ref[rows_c, :].astype(f32)  # [c, kp]
        v = v_ref[rows_c, :].astype(f32)  # [c, bv]
        g_in = gc_ref[rows_c].astype(f32)  # [c]  G
        beta = beta_ref[rows_c].astype(f32)  # [c]

        # ---- INTRA-CHUNK: UT transform, independent of the entering state ----------------------
        diff = g_in[:, None] - g_in[None, :]  # G_i − G_j
        decay = jnp.where(incl, jnp.exp(jnp.where(incl, diff, 0.0)), 0.0)  # L, masked before exp
        kk = _dot_nt(k, k)  # [c, c]
        qk = _dot_nt(q, k)  # [c, c]
        a = jnp.where(strict, beta[:, None] * kk * decay, 0.0)

        def solve_row(i, t):  # row i of T = e_i − Σ_{j<i} A_ij T_j (rows < i already final)
            a_i = jnp.sum(jnp.where(rows == i, a, 0.0), axis=0)  # [c], A_i· by column j
            row = jnp.sum(a_i[:, None] * t, axis=0)  # [c]
            return jnp.where(rows == i, eye - row[None, :], t)

        t_inv = jax.lax.fori_loop(1, c, solve_row, eye)  # (I + A)⁻¹
        e_g = jnp.exp(g_in)  # [c]
        u_part = _dot(t_inv, beta[:, None] * v)  # U = T(βV)       [c, bv]
        w = _dot(t_inv, beta[:, None] * k * e_g[:, None])  # W = T(βK⊙e^G)  [c, kp]

        # ---- INTER-CHUNK: apply the entering state ------------------------------------------
        u = u_part - _dot(w, state)  # V' = u_t          [c, bv]
        o = cfg.scale * (_dot(q * e_g[:, None], state) + _dot(qk * decay, u))
        o_ref[rows_c, :] = o.astype(o_ref.dtype)
        u_ref[rows_c, :] = u
        if cfg.return_states:
            (s_ref,) = states_ref

            def state_at(i, carry):  # S_i = e^{G_i} S + Σ_j L_ij k_j u_jᵀ
                l_i = jnp.sum(jnp.where(rows == i, decay, 0.0), axis=0)  # [c]
                eg_i = jnp.sum(jnp.where(pos == i, e_g, 0.0))
                s_ref[start + i] = eg_i * state + _dot_tn(k * l_i[:, None], u)
                return carry

            jax.lax.fori_loop(0, c, state_at, 0)
        g_last = jnp.sum(jnp.where(pos == c - 1, g_in, 0.0))  # G_C (padding has g = 0)
        k_to_end = k * jnp.exp(g_last - g_in)[:, None]  # K ⊙ e^{G_C − G}
        return jnp.exp(g_last) * state + _dot_tn(k_to_end, u)

    # ---- FINALIZE -------------------------------------------------------------------------------
    final_ref[...] = jax.lax.fori_loop(0, n_chunks, chunk_step, s0_ref[...].astype(f32))


# ---- the wrapper: padding, layout, pallas_call ----------------------------------------------


def _triton_params(num_warps: int):
    """Selects the Triton lowering explicitly (Mosaic GPU is the default GPU lowering). Imported
    lazily: the Triton backend is deprecated from JAX 0.11, and a JAX without it must still import
    mtpspec; only compiling this kernel then fails, with this message."""
    try:
        from jax.experimental.pallas import triton as pl_triton
    except ImportError as e:
        raise ValueError(
            f"gated_delta_rule(method='pallas') needs the Pallas Triton lowering, which this JAX "
            f"({jax.__version__}) does not provide: {e}"
        ) from e
    return pl_triton.CompilerParams(num_warps=num_warps, num_stages=1)


def _pallas_forward(q, k, v, g, beta, s0, cfg: PallasConfig):
    """Pads, calls the kernel, slices. Returns (o f32, final, u, states or None)."""
    b, t, hk, dk = k.shape
    hv, dv = v.shape[2:]
    r = hv // hk
    c = cfg.chunk
    compiler_params = None if cfg.interpret else _triton_params(cfg.num_warps)
    n = -(-t // c)
    tp = n * c
    kp, vp = padded_dim(dk), padded_dim(dv)
    bv = min(vp, cfg.block_v)
    nvb = vp // bv
    f32 = jnp.float32

    def pad(x, *widths):
        return jnp.pad(x, [(0, 0), (0, tp - t)] + [(0, w) for w in widths])

    q, k = pad(q, 0, kp - dk), pad(k, 0, kp - dk)  # [b, tp, hk, kp], input dtype
    v = pad(v, 0, vp - dv)  # [b, tp, hv, vp]
    g = pad(g.astype(f32), 0)  # [b, tp, hv]; padded positions: g = 0
    g_in = jnp.cumsum(g.reshape(b, n, c, hv), axis=2).reshape(b, tp, hv)  # chunk-local G
    beta = pad(beta.astype(f32), 0)  # padded positions: β = 0
    s0 = jnp.pad(s0.astype(f32), [(0, 0), (0, 0), (0, kp - dk), (0, vp - dv)])

    qk_spec = pl.BlockSpec((None, tp, None, kp), lambda bi, hi, vi: (bi, 0, hi // r, 0))
    val_spec = pl.BlockSpec((None, tp, None, bv), lambda bi, hi, vi: (bi, 0, hi, vi))
    gate_spec = pl.BlockSpec((None, tp, None), lambda bi, hi, vi: (bi, 0, hi))
    state_spec = pl.BlockSpec((None, None, kp, bv), lambda bi, hi, vi: (bi, hi, 0, vi))
    out_shape = [
        jax.ShapeDtypeStruct((b, tp, hv, vp), f32),  # o
        jax.ShapeDtypeStruct((b, tp, hv, vp), f32),  # u
        jax.ShapeDtypeStruct((b, hv, kp, vp), f32),  # final state
    ]
    out_specs = [val_spec, val_spec, state_spec]
    if cfg.return_states:
        out_shape.append(jax.ShapeDtypeStruct((b, tp, hv, kp, vp), f32))
        out_specs.append(
            pl.BlockSpec((None, tp, None, kp, bv), lambda bi, hi, vi: (bi, 0, hi, 0, vi))
        )
    kernel = functools.partial(_gdn_kernel, cfg=cfg, n_chunks=n)
    outs = pl.pallas_call(
        kernel,
        out_shape=out_shape,
        grid=(b, hv, nvb),
        in_specs=[qk_spec, qk_spec, val_spec, gate_spec, gate_spec, state_spec],
        out_specs=out_specs,
        compiler_params=compiler_params,
        interpret=cfg.interpret,
        name=f"gdn_chunk{c}" + ("_states" if cfg.return_states else ""),
    )(q, k, v, g_in, beta, s0)
    o, u, final = outs[:3]
    states = outs[3][:, :t, :, :dk, :dv] if cfg.return_states else None
    return o[:, :t, :, :dv], final[:, :, :dk, :dv], u[:, :t, :, :dv], states


def _xla_form(q, k, v, g, beta, s0, cfg: PallasConfig):
    """The chunked XLA form at the same inputs and outputs: what the backward differentiates."""
    hv = v.shape[2]
    f32 = jnp.float32
    qe, ke = (expand_key_heads(x.astype(f32), hv) for x in (q, k))
    chunk = min(cfg.chunk, q.shape[1])
    o, final, aux = chunked(
        qe, ke, v.astype(f32), g.astype(f32), beta.astype(f32), s0.astype(f32),
        cfg.scale, cfg.return_states, chunk,
    )  # fmt: skip
    return o, final, aux.u, aux.states


@functools.partial(jax.custom_vjp, nondiff_argnums=(6,))
def gdn_pallas(
    q: jax.Array,  # [b, t, hk, k] float32 or bfloat16
    k: jax.Array,  # [b, t, hk, k]
    v: jax.Array,  # [b, t, hv, v]
    g: jax.Array,  # [b, t, hv] log-decay (<= 0)
    beta: jax.Array,  # [b, t, hv]
    s0: jax.Array,  # [b, hv, k, v] float32
    cfg: PallasConfig,
) -> tuple[jax.Array, jax.Array, jax.Array, jax.Array | None]:
    """(o [b, t, hv, v] f32, final [b, hv, k, v] f32, u [b, t, hv, v] f32, states or None).

    Forward: the Pallas kernel. Backward (custom_vjp): the chunked XLA form's VJP."""
    return _pallas_forward(q, k, v, g, beta, s0, cfg)


def _gdn_pallas_fwd(q, k, v, g, beta, s0, cfg):
    return _pallas_forward(q, k, v, g, beta, s0, cfg), (q, k, v, g, beta, s0)


def _gdn_pallas_bwd(cfg, residuals, cotangents):
    _, vjp = jax.vjp(functools.partial(_xla_form, cfg=cfg), *residuals)
    return vjp(cotangents)


gdn_pallas.defvjp(_gdn_pallas_fwd, _gdn_pallas_bwd)
