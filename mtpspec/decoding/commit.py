"""Commit a verified window to exactly its accepted prefix.

After verification folded the whole window [pending, d_1..d_k] into ``verified``, the state is
rebuilt from the kept pre-draft ``snapshot`` (free: the state is immutable) for n = a + 1 accepted
positions per sequence (n = 0 leaves the snapshot unchanged):

  GDN recurrent state, by strategy (results equal):
    "scan"    masked ``lax.scan`` re-advance of the recurrence over the saved per-position inputs
              (k, v, g, β); always t steps, masked by n (static shapes).
    "states"  select the per-position state S_n that verification returned (needs
              ``gdn_states=True`` in the verify pass).
    "replay"  closed form S_n = e^{G_n} S_0 + Σ_{i≤n} e^{G_n − G_i} k_i u_iᵀ from the u_t the
              verify pass already computed (``ops.state_after``; with ``native``, set where the
              window's GDN ran the C++ kernel, one C++ call per layer, ``cpu_gdn.commit``, which
              takes the window's final state as is where all t positions are kept).
  GDN conv window: slice of [old window ‖ window inputs] at offset n.
  Attention KV (target): the verified cache with length L + n; rows beyond are stale, masked.

A tree window (``models.tree``) is committed by the same function: its accepted node's path
(``rows``) is gathered out of the commit data first — along a path, keys, values, decays and
updates are exactly a chain window's — and the path's attention keys move from the slots
L + row they were written at to L .. L + depth. A chain is the fast form: its path is the
window's first n rows in place, nothing is gathered or moved.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp

from mtpspec import ops
from mtpspec.decoding import window
from mtpspec.models.state import DecodeState, GDNCache, GDNCommit
from mtpspec.ops import GDNAux

COMMIT_STRATEGIES = ("scan", "states", "replay")


def _scan_state(state0, commit: GDNCommit, n):
    """Re-advance the recurrence over the first n window positions (masked scan)."""
    k, v, g, beta = commit.k, commit.v, commit.g, commit.beta
    t = k.shape[1]
    hi = jax.lax.Precision.HIGHEST

    def step(state, xs):
        j, k_t, v_t, g_t, b_t = xs  # [b, h, dk], [b, h, dv], [b, h], [b, h]
        new = state * jnp.exp(g_t)[..., None, None]
        u = b_t[..., None] * (v_t - jnp.einsum("bhkv,bhk->bhv", new, k_t, precision=hi))
        new = new + k_t[..., :, None] * u[..., None, :]
        keep = (j < n)[:, None, None, None]
        return jnp.where(keep, new, state), None

    xs = (jnp.arange(t),) + tuple(
        jnp.moveaxis(x, 1, 0).astype(jnp.float32) for x in (k, v, g, beta)
    )
    final, _ = jax.lax.scan(step, state0, xs)
    return final


def _select_state(state0, commit: GDNCommit, n):
    states = commit.aux.states
    if states is None:
        raise ValueError("commit='states' needs per-position states from verification")
    idx = jnp.clip(n - 1, 0, states.shape[1] - 1)
    picked = jnp.take_along_axis(states, idx[:, None, None, None, None], axis=1)[:, 0]
    return jnp.where((n > 0)[:, None, None, None], picked, state0)


def commit_gdn(
    cache0: GDNCache,
    commit: GDNCommit,
    n: jax.Array,
    strategy: str,
    native: bool = False,
    final: jax.Array | None = None,
) -> GDNCache:
    """The GDN cache after the first ``n`` [b] positions of the verified window. ``native``: the
    "replay" strategy runs the C++ closed form (``ops.commit_state``), which takes ``final`` (the
    state the window ended in, when given) as is for rows that keep the whole window."""
    if strategy == "scan":
        state = _scan_state(cache0.state, commit, n)
    elif strategy == "states":
        state = _select_state(cache0.state, commit, n)
    elif strategy == "replay":
        state = ops.commit_state(cache0.state, commit.k, commit.aux, n, native=native, final=final)
    else:
        raise ValueError(
            f"unknown commit strategy {strategy!r}; expected one of {COMMIT_STRATEGIES}"
        )
    conv = ops.conv_window_after(cache0.conv, commit.conv_in, n)
    return GDNCache(state, conv.astype(cache0.conv.dtype))


def path_commit(data: GDNCommit, rows) -> GDNCommit:
    """A GDN layer's commit data restricted to window rows ``rows`` [b, m] (a tree node's path):
    along a path, keys, values, decays and updates are exactly a chain window's."""
    aux = data.aux
    along = lambda x: window.along(x, rows)  # noqa: E731
    states = None if aux.states is None else along(aux.states)
    return GDNCommit(
        along(data.conv_in),
        along(data.k),
        along(data.v),
        along(data.g),
        along(data.beta),
        GDNAux(u=along(aux.u), g_cum=along(aux.g_cum), states=states),
    )


def commit_window(
    snapshot: DecodeState,  # before the verify window
    verified: DecodeState,  # after the window (a tree window: its keys at slots L + row)
    commits: tuple,  # per layer: GDNCommit, or AttentionCommit (nothing to keep)
    n: jax.Array,  # [b] int32: positions to keep (0: nothing, an inactive sequence)
    strategy: str,
    native: bool = False,  # the window's GDN ran the C++ kernel: so does a "replay" commit
    rows: jax.Array | None = None,  # [b, d + 1] the kept path's window rows; None: a chain's
) -> DecodeState:
    """The target state holding exactly the first ``n`` positions of the accepted path: the one
    commit of chains and trees. ``rows`` None (a chain: the path is rows 0..n − 1 in place) is
    the fast form; with ``rows`` (a tree node's path, ``window.path_rows``) the path's GDN
    commit data is gathered (then the same three strategies) and its attention keys and values
    move from slots L + row to L .. L + depth."""
    if rows is not None:
        b, m = rows.shape
        slots_from = snapshot.lengths[:, None] + rows  # where the path's keys were written
        slots_to = snapshot.lengths[:, None] + jnp.arange(m, dtype=jnp.int32)[None]
        bi = jnp.arange(b)[:, None]
    layers = []
    for before, after, data in zip(snapshot.layers, verified.layers, commits, strict=True):
        if isinstance(before, GDNCache):
            if rows is None:  # the window's final state is the state of rows keeping all t
                layers.append(commit_gdn(before, data, n, strategy, native, final=after.state))
            else:
                layers.append(commit_gdn(before, path_commit(data, rows), n, strategy, native))
        elif rows is None:  # attention: keep the written KV, rewind the length
            layers.append(after)
        else:
            k = after.k[bi, :, slots_from]  # [b, m, g, d]
            v = after.v[bi, :, :, slots_from]  # [b, m, g, d]
            layers.append(
                after._replace(
                    k=after.k.at[bi, :, slots_to].set(k, mode="drop"),
                    v=after.v.at[bi, :, :, slots_to].set(v, mode="drop"),
                )
            )
    return verified._replace(layers=tuple(layers), lengths=snapshot.lengths + n)


def rewind_kv_only(snapshot: DecodeState, verified: DecodeState, n: jax.Array) -> DecodeState:
    """The WRONG commit (negative control): rewind lengths only, keep the GDN caches as verified.
    Correct for pure-attention models, silently corrupt for recurrent layers."""
    return verified._replace(lengths=snapshot.lengths + n)
