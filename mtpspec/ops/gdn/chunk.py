"""Chunked (WY / UT transform) gated delta rule: matrix products within a chunk, a scan across.

Within one chunk of C positions (G = cumsum(g) inside the chunk, S the state entering it):
    L_ij = e^{G_i − G_j} for i ≥ j, else 0     (difference masked with ``where`` before ``exp``)
    A    = strict_tril(diag(β) K Kᵀ ⊙ L)
    T    = (I + A)⁻¹                            (unit lower-triangular; recursive 2×2 blocks)
    U    = T (β V),   W = T (β K ⊙ e^G)
    V'   = U − W S                              (exactly the u_t of the recurrence)
    O    = scale · [(Q ⊙ e^G) S + tril(Q Kᵀ ⊙ L) V']
    S'   = e^{G_C} S + (K ⊙ e^{G_C − G})ᵀ V'
T need not be a multiple of C: the tail is padded with g = 0, β = 0, k = v = 0, which leaves the
state untouched (u = 0, no decay), so padding is exact.

All per-chunk work runs inside one ``lax.scan`` body, batched over (batch, heads): on CPU, XLA runs
a few head-batched products per chunk far faster than chunk×head-batched products of small
matrices, and a batched triangular solve was the slowest piece of all (measured in BUILD_NOTES.md).
"""

from __future__ import annotations

import jax
import jax.numpy as jnp

from mtpspec.ops.gdn.common import GDNAux, einsum


def unit_lower_inverse(a: jax.Array) -> jax.Array:
    """(I + a)⁻¹ for strictly lower-triangular ``a`` [..., c, c].

    Recursive 2×2 block inversion, all blocks of one size at once:
    [[T₁₁, 0], [A₂₁, T₂₂]]⁻¹ = [[T₁₁⁻¹, 0], [−T₂₂⁻¹ A₂₁ T₁₁⁻¹, T₂₂⁻¹]], starting from 1×1 blocks
    (= 1). log₂ c levels of batched matmuls; c is zero-padded to a power of two (exact: the padded
    block is the identity).
    """
    c = a.shape[-1]
    c2 = 1 << (c - 1).bit_length()
    if c2 != c:
        a = jnp.pad(a, [(0, 0)] * (a.ndim - 2) + [(0, c2 - c), (0, c2 - c)])
    lead = a.shape[:-2]
    blocks = jnp.ones(lead + (c2, 1, 1), a.dtype)  # inverses of the 1×1 diagonal blocks
    s = 1
    while s < c2:
        nb = c2 // (2 * s)
        tiled = a.reshape(lead + (nb, 2 * s, nb, 2 * s))
        diag = jnp.moveaxis(jnp.diagonal(tiled, axis1=-4, axis2=-2), -1, -3)  # [..., nb, 2s, 2s]
        a21 = diag[..., s:, :s]
        pairs = blocks.reshape(lead + (nb, 2, s, s))
        t11, t22 = pairs[..., 0, :, :], pairs[..., 1, :, :]
        t21 = -einsum("...ij,...jk,...kl->...il", t22, a21, t11)
        top = jnp.concatenate([t11, jnp.zeros_like(t11)], axis=-1)
        bottom = jnp.concatenate([t21, t22], axis=-1)
        blocks = jnp.concatenate([top, bottom], axis=-2)
        s *= 2
    return blocks[..., 0, :c, :c]


def chunked(
    q: jax.Array,  # [b, t, h, k] float32, key heads expanded to value heads
    k: jax.Array,  # [b, t, h, k] float32
    v: jax.Array,  # [b, t, h, v] float32
    g: jax.Array,  # [b, t, h] float32
    beta: jax.Array,  # [b, t, h] float32
    initial_state: jax.Array,  # [b, h, k, v] float32
    scale: float,
    return_states: bool,
    chunk_size: int,
) -> tuple[jax.Array, jax.Array, GDNAux]:
    """Returns (o [b, t, h, v] f32, final state [b, h, k, v] f32, aux)."""
    b, t, h, _ = k.shape
    dv = v.shape[-1]
    c = chunk_size
    n = -(-t // c)
    pad = n * c - t

    # ---- PREPARATION: pad to whole chunks, lay out as [n, b, h, c, ...] -----------------------
    def chunks(x):
        x = jnp.pad(x, [(0, 0), (0, pad)] + [(0, 0)] * (x.ndim - 2))
        x = jnp.moveaxis(x, 2, 1).reshape(b, h, n, c, *x.shape[3:])
        return jnp.moveaxis(x, 2, 0)

    incl = jnp.tril(jnp.ones((c, c), dtype=bool))
    strict = jnp.tril(jnp.ones((c, c), dtype=bool), k=-1)

    def step(state, xs):  # state [b, h, k, v], entering this chunk
        q_c, k_c, v_c, g_c, b_c = xs  # [b, h, c, ·]
        # ---- INTRA-CHUNK: the UT transform, independent of the entering state ----------------
        g_in = jnp.cumsum(g_c, axis=-1)  # G, [b, h, c]
        decay = jnp.exp(jnp.where(incl, g_in[..., :, None] - g_in[..., None, :], -jnp.inf))  # L
        qk_kk = einsum("bhik,bhjk->bhij", jnp.concatenate([q_c, k_c], axis=-2), k_c)
        qk, kk = qk_kk[..., :c, :], qk_kk[..., c:, :]
        a = jnp.where(strict, b_c[..., :, None] * kk * decay, 0.0)
        e_g = jnp.exp(g_in)[..., None]
        rhs = jnp.concatenate([b_c[..., None] * v_c, b_c[..., None] * k_c * e_g], axis=-1)
        sol = einsum("bhij,bhjd->bhid", unit_lower_inverse(a), rhs)
        u_part, w = sol[..., :dv], sol[..., dv:]  # U = T(βV), W = T(βK⊙e^G)
        # ---- INTER-CHUNK: apply the entering state -------------------------------------------
        u = u_part - einsum("bhck,bhkv->bhcv", w, state)  # V'
        o_c = scale * (
            einsum("bhck,bhkv->bhcv", q_c * e_g, state) + einsum("bhij,bhjv->bhiv", qk * decay, u)
        )
        g_last = g_in[..., -1]
        k_to_end = k_c * jnp.exp(g_last[..., None] - g_in)[..., None]  # K ⊙ e^{G_C − G}
        new_state = jnp.exp(g_last)[..., None, None] * state + einsum(
            "bhck,bhcv->bhkv", k_to_end, u
        )
        states_c = None
        if return_states:  # S_i = e^{G_i} S + Σ_{j≤i} L_ij k_j u_jᵀ
            states_c = e_g[..., None] * state[:, :, None] + einsum(
                "bhij,bhjk,bhjv->bhikv", decay, k_c, u
            )
        return new_state, (o_c, u, states_c)

    xs = tuple(chunks(x) for x in (q, k, v, g, beta))
    final, (o, u, states) = jax.lax.scan(step, initial_state, xs)

    # ---- FINALIZE: back to [b, t, h, ...], drop the padding ----------------------------------
    def unchunk(x):  # [n, b, h, c, ...] -> [b, t, h, ...]
        x = jnp.moveaxis(x, 0, 2).reshape(b, h, n * c, *x.shape[4:])
        return jnp.moveaxis(x, 1, 2)[:, :t]

    o, u = unchunk(o), unchunk(u)
    if states is not None:
        states = unchunk(states)
    return o, final, GDNAux(u=u, g_cum=jnp.cumsum(g, axis=1), states=states)
