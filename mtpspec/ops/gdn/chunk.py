"""Chunked (WY / UT transform) gated delta rule: matrix products within a chunk, a scan across.

Within one chunk of C positions (G = cumsum(g) inside the chunk, S the state entering it):
    L_ij = e^{G_i − G_j} for i ≥ j, else 0     (difference masked with ``where`` before ``exp``)
    A    = strict_tril(diag(β) K Kᵀ ⊙ L)
    T    = (I + A)⁻¹                            (unit lower-triangular solve)
    U    = T (β V),   W = T (β K ⊙ e^G)
    V'   = U − W S                              (exactly the u_t of the recurrence)
    O    = scale · [(Q ⊙ e^G) S + tril(Q Kᵀ ⊙ L) V']
    S'   = e^{G_C} S + (K ⊙ e^{G_C − G})ᵀ V'
T need not be a multiple of C: the tail is padded with g = 0, β = 0, k = v = 0, which leaves the
state untouched (u = 0, no decay), so padding is exact.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp

from mtpspec.ops.gdn.common import GDNAux, einsum


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
    b, t, h, dk = k.shape
    dv = v.shape[-1]
    c = chunk_size
    n = -(-t // c)
    pad = n * c - t

    # ---- PREPARATION: pad to whole chunks, lay out as [b, h, n, c, ...] -----------------------
    def chunks(x):
        x = jnp.pad(x, [(0, 0), (0, pad)] + [(0, 0)] * (x.ndim - 2))
        x = jnp.moveaxis(x, 2, 1)  # [b, h, t', ...]
        return x.reshape(b, h, n, c, *x.shape[3:])

    qc, kc, vc, gc, bc = (chunks(x) for x in (q, k, v, g, beta))
    g_in = jnp.cumsum(gc, axis=-1)  # [b, h, n, c]
    g_last = g_in[..., -1]  # [b, h, n]

    # ---- INTRA-CHUNK: everything that does not depend on the entering state ------------------
    incl = jnp.tril(jnp.ones((c, c), dtype=bool))
    strict = jnp.tril(jnp.ones((c, c), dtype=bool), k=-1)
    diff = g_in[..., :, None] - g_in[..., None, :]  # [b, h, n, c, c]
    decay = jnp.exp(jnp.where(incl, diff, -jnp.inf))  # L; zero above the diagonal
    kk = einsum("bhnik,bhnjk->bhnij", kc, kc)
    a = jnp.where(strict, bc[..., :, None] * kk * decay, 0.0)
    rhs = jnp.concatenate([bc[..., None] * vc, bc[..., None] * kc * jnp.exp(g_in)[..., None]], -1)
    eye = jnp.eye(c, dtype=a.dtype)
    sol = jax.lax.linalg.triangular_solve(
        a + eye, rhs, left_side=True, lower=True, unit_diagonal=True
    )
    u_part, w = sol[..., :dv], sol[..., dv:]  # U = T(βV), W = T(βK⊙e^G)
    qk = einsum("bhnik,bhnjk->bhnij", qc, kc) * decay  # tril(QKᵀ ⊙ L)
    q_decayed = qc * jnp.exp(g_in)[..., None]
    k_to_end = kc * jnp.exp(g_last[..., None] - g_in)[..., None]  # K ⊙ e^{G_C − G}

    # ---- INTER-CHUNK: carry the state across chunks -------------------------------------------
    def step(state, xs):  # state [b, h, k, v], entering this chunk
        u_c, w_c, qk_c, qd_c, kend_c, glast_c, decay_c, k_c, gin_c = xs
        u_true = u_c - einsum("bhck,bhkv->bhcv", w_c, state)  # V'
        o_c = scale * (
            einsum("bhck,bhkv->bhcv", qd_c, state) + einsum("bhij,bhjv->bhiv", qk_c, u_true)
        )
        new_state = jnp.exp(glast_c)[..., None, None] * state + einsum(
            "bhck,bhcv->bhkv", kend_c, u_true
        )
        states_c = None
        if return_states:
            # S_i = e^{G_i} S + Σ_{j≤i} L_ij k_j u_jᵀ (L is zero for j > i)
            states_c = jnp.exp(gin_c)[..., None, None] * state[:, :, None] + einsum(
                "bhij,bhjk,bhjv->bhikv", decay_c, k_c, u_true
            )
        return new_state, (o_c, u_true, states_c)

    xs = (u_part, w, qk, q_decayed, k_to_end, g_last, decay, kc, g_in)
    xs = tuple(jnp.moveaxis(x, 2, 0) for x in xs)  # scan over chunks
    final, (o, u, states) = jax.lax.scan(step, initial_state, xs)

    # ---- FINALIZE: back to [b, t, h, ...], drop the padding ----------------------------------
    def unchunk(x):  # [n, b, h, c, ...] -> [b, t, h, ...]
        x = jnp.moveaxis(x, 0, 2).reshape(b, h, n * c, *x.shape[4:])
        return jnp.moveaxis(x, 1, 2)[:, :t]

    o, u = unchunk(o), unchunk(u)
    if states is not None:
        states = unchunk(states)
    return o, final, GDNAux(u=u, g_cum=jnp.cumsum(g, axis=1), states=states)
