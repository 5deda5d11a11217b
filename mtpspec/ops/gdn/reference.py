"""The gated delta rule as the token recurrence (``lax.scan``): the reference every form must match.

Per value head, with S ∈ R^{k×v}:
    S ← e^{g_t} S
    u_t = β_t (v_t − Sᵀ k_t)
    S ← S + k_t u_tᵀ
    o_t = Sᵀ (scale · q_t)
"""

from __future__ import annotations

import jax
import jax.numpy as jnp

from mtpspec.ops.gdn.common import GDNAux, einsum


def recurrent(
    q: jax.Array,  # [b, t, h, k] float32, key heads already expanded to value heads
    k: jax.Array,  # [b, t, h, k] float32
    v: jax.Array,  # [b, t, h, v] float32
    g: jax.Array,  # [b, t, h] float32, log-decay (<= 0)
    beta: jax.Array,  # [b, t, h] float32
    initial_state: jax.Array,  # [b, h, k, v] float32
    scale: float,
    return_states: bool,
) -> tuple[jax.Array, jax.Array, GDNAux]:
    """Returns (o [b, t, h, v] f32, final state [b, h, k, v] f32, aux)."""

    def step(state, xs):
        q_t, k_t, v_t, g_t, b_t = xs  # [b, h, k], [b, h, k], [b, h, v], [b, h], [b, h]
        state = state * jnp.exp(g_t)[..., None, None]
        u_t = b_t[..., None] * (v_t - einsum("bhkv,bhk->bhv", state, k_t))
        state = state + k_t[..., :, None] * u_t[..., None, :]
        o_t = einsum("bhkv,bhk->bhv", state, q_t * scale)
        return state, (o_t, u_t, state if return_states else None)

    xs = tuple(jnp.moveaxis(x, 1, 0) for x in (q, k, v, g, beta))
    final, (o, u, states) = jax.lax.scan(step, initial_state, xs)
    o = jnp.moveaxis(o, 0, 1)
    u = jnp.moveaxis(u, 0, 1)
    if states is not None:
        states = jnp.moveaxis(states, 0, 1)
    return o, final, GDNAux(u=u, g_cum=jnp.cumsum(g, axis=1), states=states)
