"""Tree verify windows on the hybrid model: one forward over every node of a static draft tree.

A tree of branching (b_1, ..., b_d) has a root (the pending token, window row 0) and b_1 ⋯ b_i
nodes at depth i, each with b_{i+1} children; rows are numbered breadth first (depth by depth,
children of a node consecutive, in the order of their parents). A node's *path* is the rows from
the root to it; the window must give each node exactly what a chain over its path would:

  attention  row r sits at position L + depth(r) and sees the committed prefix plus its path (the
             ancestor mask); its key and value are written at cache slot L + r (the commit moves
             the accepted path's rows to L .. L + depth)
  GDN        per-depth recurrence: the nodes of one depth advance from their parents' states in
             one vectorised step (``ops.gated_delta_rule_tree``); the conv reads each node's own
             path (``ops.causal_conv1d_tree``)
  MLP, norms row by row, as in a chain

``decoder.window_step_impl(..., tree=shape)`` runs these layers (``tree_layer``) and returns the
logits and hidden of every node, the state with the window's keys written (lengths unchanged) and
per layer the commit data (``GDNCommit`` with per-node states and path-cumulative decays), from
which ``decoding.commit.commit_window`` builds the state of any node's path exactly.
"""

from __future__ import annotations

import dataclasses
import functools
import math
import operator

import jax
import jax.numpy as jnp
import numpy as np

from mtpspec import ops
from mtpspec.config import ModelConfig
from mtpspec.kernels import cpu_attention
from mtpspec.models import layers
from mtpspec.models.state import AttentionCache, GDNCache, GDNCommit

HIGHEST = jax.lax.Precision.HIGHEST
# The largest tree window: rows (root included) per verify step. Far above what pays on any
# hardware measured; it bounds the index tables and the per-node GDN states ([b, R, h, k, v]).
MAX_ROWS = 128


@dataclasses.dataclass(frozen=True)
class TreeShape:
    """A static draft tree: ``branching`` (b_1, ..., b_d), every b_i >= 1. Hashable (part of a
    compiled program's key); the index tables are NumPy, built once.

    It is the one description of a verify window (``Window``): its rows, each row's position
    (``row_depth``), parent and the rows it sees (``ancestor_mask``). A chain of k drafts is the
    tree of k ones (``TreeShape.chain(k)``); verify, accept and commit take either."""

    branching: tuple[int, ...]

    def __post_init__(self):
        b = self.branching
        if not isinstance(b, tuple) or not b:
            raise ValueError(f"tree branching must be a non-empty tuple of ints, got {b!r}")
        for x in b:
            if isinstance(x, bool) or not isinstance(x, int) or x < 1:
                raise ValueError(f"tree branching factors must be ints >= 1, got {b!r}")
        rows = sum(math.prod(b[:i]) for i in range(len(b) + 1))
        if rows > MAX_ROWS:
            raise ValueError(
                f"tree {b} has {rows} rows (root included); at most {MAX_ROWS} are supported "
                "(every row is a verify-window token and keeps its own GDN states)"
            )

    @classmethod
    def chain(cls, k: int) -> TreeShape:
        """The window of a chain of ``k`` >= 1 drafts: a tree whose branching is all ones."""
        return cls((1,) * k)

    @property
    def is_chain(self) -> bool:
        """Every node has one child: row r is the chain's position r, its path rows 0..r (the
        chain's fast forms apply: causal windows, the C++ window kernels, the in-place commit)."""
        return all(b == 1 for b in self.branching)

    @property
    def depth(self) -> int:
        return len(self.branching)

    @functools.cached_property
    def level_sizes(self) -> tuple[int, ...]:
        """Nodes per depth 0..d (depth 0: the root)."""
        return tuple(math.prod(self.branching[:i]) for i in range(self.depth + 1))

    @property
    def rows(self) -> int:
        """Window rows: the root and every draft node."""
        return sum(self.level_sizes)

    @property
    def nodes(self) -> int:
        """Draft nodes (the root excluded)."""
        return self.rows - 1

    @functools.cached_property
    def parent(self) -> np.ndarray:
        """[rows] int: each row's parent row (−1 for the root)."""
        out, start = [-1], 0
        for i, b in enumerate(self.branching):
            n = self.level_sizes[i]
            out += [start + j // b for j in range(n * b)]
            start += n
        return np.asarray(out, np.int32)

    @functools.cached_property
    def row_depth(self) -> np.ndarray:
        """[rows] int: depth of each row (root 0)."""
        return np.repeat(np.arange(self.depth + 1), self.level_sizes).astype(np.int32)

    @functools.cached_property
    def levels(self) -> tuple[tuple[int, int], ...]:
        """(first row, end row) of each depth 0..d."""
        ends = np.cumsum(self.level_sizes)
        return tuple((int(e - n), int(e)) for n, e in zip(self.level_sizes, ends, strict=True))

    @functools.cached_property
    def path(self) -> np.ndarray:
        """[rows, d + 1] int: row r's path, root first (entries past its depth repeat r)."""
        out = np.zeros((self.rows, self.depth + 1), np.int32)
        for r in range(self.rows):
            chain = [r]
            while self.parent[chain[-1]] >= 0:
                chain.append(int(self.parent[chain[-1]]))
            chain = chain[::-1]
            out[r] = chain + [r] * (self.depth + 1 - len(chain))
        return out

    @functools.cached_property
    def first_child(self) -> np.ndarray:
        """[rows] int: each row's first child row (its b_{i+1} children are consecutive); −1 for
        the leaves."""
        out = np.full(self.rows, -1, np.int32)
        for r in range(1, self.rows):
            p = int(self.parent[r])
            if out[p] < 0:
                out[p] = r
        return out

    @functools.cached_property
    def ancestor_mask(self) -> np.ndarray:
        """[rows, rows] bool: row r sees row s (s on r's path, r itself included)."""
        mask = np.zeros((self.rows, self.rows), bool)
        for r in range(self.rows):
            mask[r, self.path[r, : self.row_depth[r] + 1]] = True
        return mask

    def conv_taps(self, width: int) -> np.ndarray:
        """[rows, width] int: where each row's conv reads its inputs in [old window (width − 1
        rows) ‖ window rows]: tap i is the input w − 1 − i steps back along the row's path (the
        old window once the path runs out), so tap w − 1 is the row itself."""
        taps = np.zeros((self.rows, width), np.int32)
        for r in range(self.rows):
            dep = int(self.row_depth[r])
            for i in range(width):
                back = width - 1 - i  # steps back along the path
                if back <= dep:
                    taps[r, i] = (width - 1) + self.path[r, dep - back]
                else:  # before the root: the old window, whose last row is index width − 2
                    taps[r, i] = (width - 1) - (back - dep)
        return taps


Window = TreeShape  # the verify window's description: a chain is the tree of ones


def check_tree(tree) -> TreeShape:
    """A ``TreeShape`` from a TreeShape or a sequence of branching factors (Python or NumPy ints;
    ValueError otherwise)."""
    if isinstance(tree, TreeShape):
        return tree
    if isinstance(tree, list | tuple | np.ndarray):
        try:
            tree = tuple(x if isinstance(x, bool) else operator.index(x) for x in tree)
        except TypeError:
            pass  # TreeShape names the bad factor
    return TreeShape(tree)


# ---- layers -------------------------------------------------------------------------------------


def tree_attention(config: ModelConfig, p: dict, x, lengths, cache: AttentionCache, tree):
    """Attention of every tree row: position L + depth, keys written at slots L + row, each row
    reading the committed prefix and its own path. Returns (out [b, R, H], new cache)."""
    b, t, _ = x.shape
    positions = lengths[:, None] + jnp.asarray(tree.row_depth)[None]  # [b, R]
    q, gate, k, v = layers.attention_inputs(config, p, x, positions)
    slots = lengths[:, None] + jnp.arange(t, dtype=jnp.int32)[None]  # [b, R]
    new_cache = layers.write_kv(cache, k, v, slots)
    if layers.native_attention(p, t):
        cpu_attention.TREE_KERNEL.require()  # the block's marker chose the C++ kernel: run or raise
        # the C++ kernel: the prefix, then the row's path
        scale = q.shape[-1] ** -0.5
        o = cpu_attention.apply_tree(
            q, new_cache.k, new_cache.v, lengths, tree.ancestor_mask, scale
        )
        return layers.attention_output(p, o, gate, x.dtype), new_cache
    rel = jnp.arange(cache.capacity)[None, None, :] - lengths[:, None, None]  # window row of a slot
    mask = jnp.asarray(tree.ancestor_mask)  # [R (query), R (key)]
    tree_ok = jnp.take_along_axis(
        jnp.broadcast_to(mask[None], (b, t, t)),
        jnp.broadcast_to(jnp.clip(rel, 0, t - 1), (b, t, cache.capacity)),
        axis=2,
    )
    visible = (rel < 0) | ((rel < t) & tree_ok)  # [b, R, n]: the prefix, then the row's path
    o = layers.masked_cache_attention(q, new_cache.k, new_cache.v, visible)
    return layers.attention_output(p, o, gate, x.dtype), new_cache


def tree_gdn(config: ModelConfig, p: dict, x, active, cache: GDNCache, tree, native=False):
    """GDN of every tree row from its parent's state and its path's conv inputs. ``active`` [b]
    bool: inactive sequences leave no trace (g = 0, beta = 0). ``native``: the recurrence in
    the C++ kernel. Returns (out [b, R, H], the cache unchanged, ``GDNCommit`` with per-node
    states and path-cumulative decays)."""
    mixed, z, g, beta = layers.gdn_inputs(config, p, x, active[:, None])
    taps = tree.conv_taps(p["conv"].shape[1])
    conv_out = ops.causal_conv1d_tree(mixed, p["conv"], cache.conv, taps)
    q, k, v = layers.gdn_qkv(config, conv_out)
    o, aux = ops.gated_delta_rule_tree(
        q, k, v, g, beta, cache.state, tree.parent, tree.levels, native=native
    )
    k_heads = ops.expand_key_heads(k, config.linear_num_value_heads)
    out = layers.gdn_output(config, p, o, z, x.dtype)
    return out, cache, GDNCommit(mixed, k_heads, v, g, beta, aux)


def tree_layer(
    config: ModelConfig, mlp_type: str, p: dict, x, lengths, active, cache, tree, native
):
    """One decoder layer of a tree window (``layers.hybrid_layer`` with the tree mixers): every
    row over its own path; ``active`` [b] bool; ``native``: the GDN recurrence in the C++ kernel
    (attention follows its block's marker). Returns (x, new cache: keys written at slots L + row,
    a GDN cache as before; commit data)."""
    return layers.hybrid_layer(
        config,
        mlp_type,
        p,
        x,
        lambda h, pa: tree_attention(config, pa, h, lengths, cache, tree),
        lambda h, pg: tree_gdn(config, pg, h, active, cache, tree, native),
    )
