"""Accept and commit on a tree verify window (``models.tree``).

    node, n, token = accept_greedy(tree, logits, tokens)    # the deepest node greedy would reach
    state = commit_path(snapshot, verified, commits, node, n, tree, strategy)

Greedy acceptance: a node is accepted when its token is the target's argmax at its parent and its
parent is accepted (the root always is); the accepted nodes then form one path when siblings
carry distinct tokens (ties go to the lower row), and the deepest is exactly where a chain of
plain greedy steps would be after n = depth + 1 tokens.

Commit gathers the accepted node's path out of the tree's commit data — keys, values, decays and
updates along the path are exactly a chain window's — and hands it to the chain commit
(``commit.commit_gdn``), so "scan" re-advances over the path, "states" selects the node's stored
state and "replay" is the closed form along the path. Attention keys were written at slots
L + row; the path's rows are moved to L .. L + depth.
"""

from __future__ import annotations

import jax.numpy as jnp

from mtpspec.decoding.commit import commit_gdn
from mtpspec.decoding.sampling import tree_speculative_accept
from mtpspec.kernels import cpu_gdn
from mtpspec.models.state import DecodeState, GDNCache, GDNCommit
from mtpspec.models.tree import TreeShape, window_step_tree_impl
from mtpspec.ops import GDNAux


def accept_greedy(tree: TreeShape, logits, tokens):
    """logits [b, R, V], tokens [b, R] (row 0 the root). Returns (node [b] the deepest accepted
    row, n [b] = its depth + 1, the new token [b] = the target's argmax at that node)."""
    target = jnp.argmax(logits, axis=-1).astype(jnp.int32)  # [b, R]
    parent = jnp.asarray(tree.parent)
    ok = tokens == target[:, jnp.maximum(parent, 0)]  # [b, R] (row 0's value is unused)
    ok = ok.at[:, 0].set(True)
    path = jnp.asarray(tree.path)  # [R, d + 1]
    accepted = jnp.all(ok[:, path], axis=-1)  # every row on the path matches
    rows = tree.rows
    depth = jnp.asarray(tree.row_depth)
    score = jnp.where(accepted, depth * rows + (rows - 1 - jnp.arange(rows)), -1)
    node = jnp.argmax(score, axis=-1).astype(jnp.int32)
    n = depth[node] + 1
    return node, n, jnp.take_along_axis(target, node[:, None], axis=1)[:, 0]


def path_rows(tree: TreeShape, node):
    """[b, d + 1] window rows of each node's path, root first (past its depth: the node again)."""
    return jnp.asarray(tree.path)[node]


def _along(x, rows):
    """x [b, R, ...] -> [b, d + 1, ...] rows ``rows`` [b, d + 1] of each sequence."""
    idx = rows.reshape(rows.shape + (1,) * (x.ndim - 2))
    return jnp.take_along_axis(x, idx, axis=1)


def path_commit(data: GDNCommit, rows) -> GDNCommit:
    """A GDN layer's tree commit data restricted to one path per sequence: a chain's."""
    aux = data.aux
    states = None if aux.states is None else _along(aux.states, rows)
    along = lambda x: _along(x, rows)  # noqa: E731
    return GDNCommit(
        along(data.conv_in),
        along(data.k),
        along(data.v),
        along(data.g),
        along(data.beta),
        GDNAux(u=along(aux.u), g_cum=along(aux.g_cum), states=states),
    )


def commit_path(
    snapshot: DecodeState,  # before the tree window
    verified: DecodeState,  # the tree window's state (keys at slots L + row)
    commits: tuple,  # per layer, from ``window_step_tree_impl``
    node,  # [b] accepted row
    n,  # [b] positions to keep: depth(node) + 1, or 0 (nothing: inactive)
    tree: TreeShape,
    strategy: str,
) -> DecodeState:
    """The state after exactly the path root..node (``n`` positions) of each sequence."""
    rows = path_rows(tree, node)
    b, m = rows.shape
    slots_from = snapshot.lengths[:, None] + rows  # where the path's keys were written
    slots_to = snapshot.lengths[:, None] + jnp.arange(m, dtype=jnp.int32)[None]
    bi = jnp.arange(b)[:, None]
    out = []
    for before, after, data in zip(snapshot.layers, verified.layers, commits, strict=True):
        if isinstance(before, GDNCache):
            out.append(commit_gdn(before, path_commit(data, rows), n, strategy))
            continue
        k = after.k[bi, :, slots_from]  # [b, m, g, d]
        v = after.v[bi, :, :, slots_from]  # [b, m, g, d]
        out.append(
            after._replace(
                k=after.k.at[bi, :, slots_to].set(k, mode="drop"),
                v=after.v.at[bi, :, :, slots_to].set(v, mode="drop"),
            )
        )
    return verified._replace(layers=tuple(out), lengths=snapshot.lengths + n)


def verify_accept_commit(s, params, state: DecodeState, pending, drafts, q, active, draws):
    """One tree window of the decoding loop: verify every node, accept a path (greedy: the
    deepest matching; sampling: ``sampling.tree_speculative_accept`` with the drafts' q and
    ``draws``), commit it. Returns the chain-shaped results the loop goes on with: (the
    path's drafts [b, d], accepted a [b], new token [b], n [b] (0 when inactive), the committed
    state, logits and hidden of the path's rows [b, d + 1, ...], the accepted row [b])."""
    shape = s.tree
    tokens = jnp.concatenate([pending[:, None], drafts], axis=1)  # the root, then rows 1..R−1
    # where the chain's windows would run the C++ GDN kernel
    native = s.verify_method == "ffi" and cpu_gdn.TREE_KERNEL.available()
    verified = window_step_tree_impl(s.config, params, state, tokens, shape, active, native)
    if s.sampling.greedy:
        node, n, token = accept_greedy(shape, verified.logits, tokens)
    else:
        node, n, token = tree_speculative_accept(
            draws.keys, verified.logits, tokens, q, shape, *draws.knobs
        )
    n = jnp.where(active, n, 0)
    committed = commit_path(state, verified.state, verified.commit, node, n, shape, s.commit)
    rows = path_rows(shape, node)
    path_drafts = jnp.take_along_axis(tokens, rows, axis=1)[:, 1:]
    logits, hidden = _along(verified.logits, rows), _along(verified.hidden, rows)
    accepted = jnp.maximum(n - 1, 0)
    return path_drafts, accepted, token, n, committed, logits, hidden, node


__all__ = ["accept_greedy", "commit_path", "path_commit", "path_rows", "verify_accept_commit"]
