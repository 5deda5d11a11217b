"""The MTP rows of one depth of a tree window (``decoding.proposers.mtp`` drafts depth by depth).

Depth 1's b_1 drafts are the top tokens of the LM head on the MTP hidden ``h`` that predicts the
token after the pending one. A node v at depth i < d then gets one MTP row, as the chained
proposer would make it on v's branch: it pairs the MTP hidden that predicted v (its parent's row;
``h`` for depth 1) with v's token, sits at MTP position ``mtp_lengths + i − 1`` and attends to
the MTP cache's committed prefix plus the rows of its own ancestors (never a sibling's); its
output hidden gives v's b_{i+1} children. One ``mtp_rows`` call covers all of a depth's nodes.
Nothing is written to the MTP cache (a chain writes its rows past the cache's length instead).
"""

from __future__ import annotations

import jax.numpy as jnp

from mtpspec.models import layers


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


def mtp_rows(config, params, state, hidden, tokens, position, own):
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
