"""The gated delta rule over a static tree of positions: every node advances from its parent's
state (the recurrence of ``reference.py`` along each root-to-node path), one depth at a time.

Rows are ordered breadth first, so a depth is a contiguous range of rows whose parents all lie in
earlier ranges (``models.tree.TreeShape``: ``parent``, ``levels``). Per depth the nodes' parent
states are gathered and advanced in one vectorised step — d + 1 steps for a tree of depth d,
whatever its width. The cost is that each node's state is materialised ([b, R, h, k, v]); that
is also what the "states" commit selects from. ``native=True`` runs the same recurrence node by
node in one C++ call per layer (``kernels.cpu_gdn.apply_tree``; decoding asks for it where its
windows' GDN resolved to the C++ kernel).
"""

from __future__ import annotations

import jax.numpy as jnp
import numpy as np

from mtpspec.kernels import cpu_gdn
from mtpspec.ops.gdn.api import G_FLOOR
from mtpspec.ops.gdn.common import GDNAux, einsum, expand_key_heads


def gated_delta_rule_tree(
    q,  # [b, R, hk, k] float32 (L2-normed)
    k,  # [b, R, hk, k]
    v,  # [b, R, hv, v]
    g,  # [b, R, hv] log-decay <= 0
    beta,  # [b, R, hv]
    initial_state,  # [b, hv, k, v] float32: the state before the root
    parent: np.ndarray,  # [R] int, −1 for the root
    levels: tuple[tuple[int, int], ...],  # (first, end) row of each depth, root first
    scale: float | None = None,
    native: bool = False,
):
    """Returns (o [b, R, hv, v] float32, ``GDNAux``: u per node, G = the log-decay summed along
    the node's path from the root (its own included), and every node's state). ``native``: the
    C++ kernel (OSError where it is not built)."""
    hv, dk = v.shape[2], k.shape[3]
    scale = float(dk**-0.5 if scale is None else scale)
    if native:
        g = jnp.maximum(g.astype(jnp.float32), G_FLOOR)
        o, u, states = cpu_gdn.apply_tree(q, k, v, g, beta, initial_state, parent, scale)
        gcums = []
        for lo, hi in levels:
            prev_g = 0.0 if lo == 0 else jnp.concatenate(gcums, axis=1)[:, parent[lo:hi]]
            gcums.append(prev_g + g[:, lo:hi])
        return o, GDNAux(u=u, g_cum=jnp.concatenate(gcums, axis=1), states=states)
    qe = expand_key_heads(q.astype(jnp.float32), hv) * scale
    ke = expand_key_heads(k.astype(jnp.float32), hv)
    v, beta = v.astype(jnp.float32), beta.astype(jnp.float32)
    g = jnp.maximum(g.astype(jnp.float32), G_FLOOR)
    states, outs, us, gcums = [], [], [], []
    for lo, hi in levels:
        par = parent[lo:hi]
        if lo == 0:  # the root continues the committed state
            prev = initial_state.astype(jnp.float32)[:, None]
            prev_g = jnp.zeros_like(g[:, lo:hi])
        else:
            all_states = jnp.concatenate(states, axis=1)
            prev = all_states[:, par]  # [b, n, h, k, v]
            prev_g = jnp.concatenate(gcums, axis=1)[:, par]
        decayed = prev * jnp.exp(g[:, lo:hi])[..., None, None]
        k_l = ke[:, lo:hi]
        u = beta[:, lo:hi, :, None] * (v[:, lo:hi] - einsum("bnhkv,bnhk->bnhv", decayed, k_l))
        new = decayed + k_l[..., :, None] * u[..., None, :]
        states.append(new)
        us.append(u)
        gcums.append(prev_g + g[:, lo:hi])
        outs.append(einsum("bnhkv,bnhk->bnhv", new, qe[:, lo:hi]))
    cat = lambda xs: jnp.concatenate(xs, axis=1)  # noqa: E731
    return cat(outs), GDNAux(u=cat(us), g_cum=cat(gcums), states=cat(states))
