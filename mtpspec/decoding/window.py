"""The verify window of one decoding step, chain or tree, and greedy acceptance on it.

A window is a ``models.tree.TreeShape`` (``Window``): row 0 the pending token, then the draft
rows breadth first, each with a parent; a chain of k drafts is the tree of k ones. One verify,
one accept and one commit serve both (``stages``); the chain's fast forms (the causal window and
its C++ kernels, the vectorised acceptance, the in-place commit) are chosen by the window's shape.

    w = window(s)                                         # None for plain decoding
    node, token = accept_greedy(w, logits, tokens)        # the deepest row greedy would reach
    rows = path_rows(w, node)                             # its path: rows root..node

Greedy acceptance: a row is accepted when its token is the target's argmax at its parent and its
parent is accepted (the root always is); the accepted rows then form one path when siblings carry
distinct tokens (ties go to the lower row), and the deepest is exactly where a chain of plain
greedy steps would be after depth + 1 tokens.
"""

from __future__ import annotations

import jax.numpy as jnp

from mtpspec import ops
from mtpspec.models.tree import TreeShape, Window


def window(s) -> Window | None:
    """The verify window of program key ``s``: its tree, else the chain of ``s.k`` drafts (the
    tree of ones); None for plain decoding (k = 0: the window is the pending token alone)."""
    if s.tree is not None:
        return s.tree
    return TreeShape.chain(s.k) if s.k else None


def rows_seen(w: Window, drafted) -> jnp.ndarray | None:
    """[b, R] bool: the rows a sequence drafted (depth <= ``drafted`` [b]); None when all were."""
    if drafted is None:
        return None
    return jnp.asarray(w.row_depth)[None, :] <= drafted[:, None]


def accept_greedy(w: Window, logits, tokens, drafted=None, ids=None):
    """logits [b, R, V] (or ``ids`` [b, R], their argmax, with logits None), tokens [b, R]
    (row 0 the root). ``drafted`` [b] (None: every row): a sequence drafted only the rows of
    depth <= drafted (an adaptive chain's shorter window). Returns (node [b] the deepest
    accepted row, the new token [b] = the target's argmax there); the accepted drafts are
    ``w.row_depth[node]``."""
    target = ops.argmax(logits) if ids is None else ids  # [b, R]
    parent = jnp.asarray(w.parent)
    ok = tokens == target[:, jnp.maximum(parent, 0)]  # [b, R] (row 0's value is unused)
    ok = ok.at[:, 0].set(True)
    seen = rows_seen(w, drafted)
    if seen is not None:
        ok = ok & seen
    if w.is_chain:  # the path of row r is rows 0..r: a running product
        node = jnp.sum(jnp.cumprod(ok[:, 1:].astype(jnp.int32), axis=1), axis=1)
        node = node.astype(jnp.int32)
    else:
        accepted = jnp.all(ok[:, jnp.asarray(w.path)], axis=-1)  # every row on the path matches
        rows, depth = w.rows, jnp.asarray(w.row_depth)
        score = jnp.where(accepted, depth * rows + (rows - 1 - jnp.arange(rows)), -1)
        node = jnp.argmax(score, axis=-1).astype(jnp.int32)
    return node, jnp.take_along_axis(target, node[:, None], axis=1)[:, 0]


def path_rows(w: Window, node):
    """[b, d + 1] window rows of each node's path, root first (past its depth: the node again)."""
    return jnp.asarray(w.path)[node]


def kept_rows(w: Window | None, node):
    """The window rows a commit gathers for each accepted ``node`` [b]: None for a chain (its
    path is its first rows, in place) and for plain decoding; a tree's ``path_rows``."""
    return None if w is None or w.is_chain else path_rows(w, node)


def along(x, rows):
    """x [b, R, ...] -> [b, d + 1, ...]: rows ``rows`` [b, d + 1] of each sequence."""
    idx = rows.reshape(rows.shape + (1,) * (x.ndim - 2))
    return jnp.take_along_axis(x, idx, axis=1)


__all__ = ["accept_greedy", "along", "kept_rows", "path_rows", "rows_seen", "window"]
