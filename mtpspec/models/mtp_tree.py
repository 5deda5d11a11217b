"""The MTP head drafting a tree: at every node the top-b children, chained along each branch.

Depth 1's b_1 drafts are the top tokens of the LM head on the MTP hidden ``h`` that predicts the
token after the pending one. A node v at depth i < d then gets one MTP row, as the chained
proposer would make it on v's branch: it pairs the MTP hidden that predicted v (its parent's row;
``h`` for depth 1) with v's token, sits at MTP position ``mtp_lengths + i − 1`` and attends to
the MTP cache's committed prefix plus the rows of its own ancestors (never a sibling's); its
output hidden gives v's b_{i+1} children. One MTP pass per depth covers all of that depth's nodes.
Nothing is written to the MTP cache (the chain's rows are throw-away there too).
"""

from __future__ import annotations

import jax
import jax.numpy as jnp

from mtpspec.config import ModelConfig
from mtpspec.models import layers
from mtpspec.models.tree import TreeShape


def _prefix_and_own_attention(q, cache, length, own_k, own_v):
    """q [b, n, hq, d] over the cache's slots < ``length`` [b] and each row's own keys
    own_k / own_v [b, n, m, g, d] (its ancestors' rows and itself), one softmax."""
    live = jnp.arange(cache.k.shape[2])[None, :] < length[:, None]  # [b, slots]
    return layers.segment_attention(
        q,
        [
            layers.Keys(cache.k, cache.v, "bgsd", "bgds", live[:, None, None, None, :]),
            layers.Keys(own_k, own_v, "btmgd", "btmgd"),
        ],
    )


def _mtp_rows(config, params, state, hidden, tokens, position, own):
    """MTP rows for one depth: hidden [b, n, H] (what predicted each node), tokens [b, n] (the
    nodes), all at MTP position ``position`` [b]; ``own`` the ancestors' (k, v) [b, n, m, g, d]
    or None. Returns (MTP output hidden [b, n, H], this depth's (k, v) [b, n, g, d])."""
    p = params["mtp"]
    layer = p["layer"]
    e = layers.norm(config, params["embed"][tokens], p["norm_embed"])
    h = layers.norm(config, hidden.astype(e.dtype), p["norm_hidden"])
    x = layers.linear(jnp.concatenate([e, h], axis=-1), p["fc"]).astype(e.dtype)
    b, n = tokens.shape
    pos = jnp.broadcast_to(position[:, None], (b, n))

    def mixer(h):
        q, gate, k, v = layers.attention_inputs(config, layer["attn"], h, pos)
        dtype = state.mtp.k.dtype  # the keys as the chain's cache would hold them
        k, v = k.astype(dtype), v.astype(dtype)
        own_k = k[:, :, None] if own is None else jnp.concatenate([own[0], k[:, :, None]], axis=2)
        own_v = v[:, :, None] if own is None else jnp.concatenate([own[1], v[:, :, None]], axis=2)
        o = _prefix_and_own_attention(q, state.mtp, state.mtp_lengths, own_k, own_v)
        return layers.attention_output(layer["attn"], o, gate, h.dtype), (own_k, own_v)

    x, mine = layers.residual_block(config, config.mtp_mlp_type, layer, x, mixer)
    return layers.norm(config, x, p["norm"]), mine


def mtp_tree_drafts(config: ModelConfig, params, state, h, tree: TreeShape, select):
    """Tree drafts: ``h`` [b, 1, H] the MTP hidden predicting the token after the pending one;
    ``select(logits [b, n, V], b_i, depth) -> (ids [b, n, b_i], q [b, n, b_i, V or 0])`` picks
    each node's children and the law each was drawn from (``greedy_select``: the top b_i, no q;
    sampling: b_i i.i.d. draws, ``decoding.proposers.mtp.sampled_children``). Returns (drafts
    of rows 1..R−1 [b, R − 1] in ``tree``'s breadth-first order, q [b, R − 1, V or 0]: the law
    each of those rows' token was drawn from)."""
    from mtpspec.models.decoder import lm_logits

    b = h.shape[0]
    ids, q = select(lm_logits(config, params, h), tree.branching[0], 0)
    levels = [ids.reshape(b, -1)]
    qs = [per_child(q)]
    hid, own = h, None
    for i in range(1, tree.depth):
        nodes = levels[-1]  # [b, n_i]
        parent_hidden = jnp.repeat(hid, tree.branching[i - 1], axis=1)  # each node's predictor
        if own is not None:  # ancestors' keys, repeated for each child
            own = tuple(jnp.repeat(x, tree.branching[i - 1], axis=1) for x in own)
        position = state.mtp_lengths + (i - 1)
        hid, own = _mtp_rows(config, params, state, parent_hidden, nodes, position, own)
        ids, q = select(lm_logits(config, params, hid), tree.branching[i], i)
        levels.append(ids.reshape(b, -1))
        qs.append(per_child(q))  # each child's own law
    return jnp.concatenate(levels, axis=1), jnp.concatenate(qs, axis=1)


def per_child(q):
    """[b, n, b_i, V] -> [b, n · b_i, V] (children in breadth-first order; V may be 0)."""
    return q.reshape(q.shape[0], q.shape[1] * q.shape[2], q.shape[3])


def top_b(logits, b: int):
    """The b most likely ids [..., b] (ties: the lower id first, as argmax)."""
    return jax.lax.top_k(logits, b)[1].astype(jnp.int32)


def greedy_select(logits, b: int, depth: int):
    """``select`` for greedy trees: the top b children, no q."""
    del depth
    return top_b(logits, b), jnp.zeros(logits.shape[:-1] + (b, 0), jnp.float32)
