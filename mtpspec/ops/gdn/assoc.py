"""Gated delta rule by ``lax.associative_scan``: every per-position state in log depth.

The recurrence is affine in the state: S_t = M_t S_{t−1} + N_t with
    M_t = e^{g_t} (I − β_t k_t k_tᵀ)   [k × k],      N_t = β_t k_t v_tᵀ   [k × v].
Pairs compose as (M₂, N₂) ∘ (M₁, N₁) = (M₂ M₁, M₂ N₁ + N₂). A prefix scan gives (A_t, B_t) with
S_t = A_t S_0 + B_t. Each combine costs k³ per head, so this suits short windows (verification), not
long prefill; it materialises [b, h, t, k, k].
"""

from __future__ import annotations

import jax
import jax.numpy as jnp

from mtpspec.ops.gdn.common import GDNAux, einsum


def assoc(
    q: jax.Array,  # [b, t, h, k] float32, key heads expanded to value heads
    k: jax.Array,  # [b, t, h, k] float32
    v: jax.Array,  # [b, t, h, v] float32
    g: jax.Array,  # [b, t, h] float32
    beta: jax.Array,  # [b, t, h] float32
    initial_state: jax.Array,  # [b, h, k, v] float32
    scale: float,
    return_states: bool,
) -> tuple[jax.Array, jax.Array, GDNAux]:
    """Returns (o [b, t, h, v] f32, final state [b, h, k, v] f32, aux)."""
    dk = k.shape[-1]
    eye = jnp.eye(dk, dtype=jnp.float32)
    decay = jnp.exp(g)[..., None, None]  # [b, t, h, 1, 1]
    m = decay * (eye - beta[..., None, None] * k[..., :, None] * k[..., None, :])  # [b,t,h,k,k]
    n = beta[..., None, None] * k[..., :, None] * v[..., None, :]  # [b, t, h, k, v]

    def combine(first, second):
        m1, n1 = first
        m2, n2 = second
        return (
            einsum("...ij,...jl->...il", m2, m1),
            einsum("...ij,...jv->...iv", m2, n1) + n2,
        )

    a_pref, b_pref = jax.lax.associative_scan(combine, (m, n), axis=1)
    states = einsum("bthij,bhjv->bthiv", a_pref, initial_state) + b_pref  # S_t, [b, t, h, k, v]

    o = einsum("bthkv,bthk->bthv", states, q * scale)
    prev = jnp.concatenate([initial_state[:, None], states[:, :-1]], axis=1)  # S_{t−1}
    u = beta[..., None] * (v - einsum("bthkv,bthk->bthv", prev * decay, k))
    final = states[:, -1]
    aux = GDNAux(u=u, g_cum=jnp.cumsum(g, axis=1), states=states if return_states else None)
    return o, final, aux
