"""The decode state: an immutable pytree passed in and returned (rollback = keep the old tree).

Shape letters: b batch, n capacity (max tokens per sequence), h heads, d head dim, k/v GDN key/value
dims, c conv channels, w conv width.
"""

from __future__ import annotations

from typing import NamedTuple

import jax
import jax.numpy as jnp

from mtpspec.config import FULL, ModelConfig
from mtpspec.ops import GDNAux


class AttentionCache(NamedTuple):
    """Fixed-capacity KV of one attention layer in the layouts decode reads in place: keys
    head-major [b, h_kv, n, d] (q·k contracts d, the minor axis), values transposed
    [b, h_kv, d, n] (p·v contracts n, now the minor axis), so grouped attention reads them
    without a transpose (BUILD_NOTES, 2026-12-01). Entries at or beyond a sequence's
    length are stale and masked, never read."""

    k: jax.Array  # [b, h_kv, n, d]
    v: jax.Array  # [b, h_kv, d, n]

    @property
    def capacity(self) -> int:
        return self.k.shape[2]

    @classmethod
    def init(cls, config: ModelConfig, batch: int, capacity: int) -> AttentionCache:
        h, d = config.num_key_value_heads, config.head_dim
        dtype = jnp.dtype(config.dtype)
        return cls(
            jnp.zeros((batch, h, capacity, d), dtype), jnp.zeros((batch, h, d, capacity), dtype)
        )


class GDNCache(NamedTuple):
    """Recurrent state (float32) and conv window (last w − 1 pre-conv inputs) of one GDN layer."""

    state: jax.Array  # [b, h_v, k, v] float32
    conv: jax.Array  # [b, w − 1, c]

    @classmethod
    def init(cls, config: ModelConfig, batch: int) -> GDNCache:
        state = jnp.zeros(
            (
                batch,
                config.linear_num_value_heads,
                config.linear_key_head_dim,
                config.linear_value_head_dim,
            ),
            jnp.float32,
        )
        conv = jnp.zeros(
            (batch, config.linear_conv_kernel_dim - 1, config.conv_channels),
            jnp.dtype(config.dtype),
        )
        return cls(state, conv)


class GDNCommit(NamedTuple):
    """What one GDN layer's verify window keeps for committing to an accepted prefix, per window
    position (b batch, t window positions, c conv channels, h value heads, k/v key/value dims).
    Padding positions (beyond a sequence's ``valid``) have g = 0 and beta = 0.

    conv_in: [b, t, c] the pre-conv inputs (the conv window after n positions is a slice of
             [old window ‖ conv_in] at offset n, ``ops.conv_window_after``);
    k:       [b, t, h, k] float32 L2-normalised keys, expanded to value heads (input of every
             commit strategy);
    v:       [b, t, h, v] float32 values (re-advanced by the "scan" commit);
    g:       [b, t, h] float32 log-decays (<= 0);
    beta:    [b, t, h] float32 write strengths in (0, 1);
    aux:     ``ops.GDNAux``: u_t (what the recurrence adds at t: the "replay" commit's input),
             cumulative log-decay G_t, and every per-position state when verification was asked
             for them (the "states" commit).
    """

    conv_in: jax.Array
    k: jax.Array
    v: jax.Array
    g: jax.Array
    beta: jax.Array
    aux: GDNAux


class AttentionCommit(NamedTuple):
    """An attention layer keeps nothing for commit: its KV rows were written at positions
    L..L+t−1 and committing n positions only moves the length to L + n (rows beyond are stale,
    masked, and overwritten by the next window)."""


class DecodeState(NamedTuple):
    """Every layer's cache plus per-sequence lengths (tokens already folded into the caches).

    ``mtp`` is the MTP layer's own KV cache; its row i pairs main-model position i with token i+1,
    so it holds ``mtp_lengths`` entries (one behind the main model once caught up).
    """

    layers: tuple  # AttentionCache | GDNCache per decoder layer
    lengths: jax.Array  # [b] int32
    mtp: AttentionCache | None
    mtp_lengths: jax.Array  # [b] int32

    @property
    def capacity(self) -> int:
        for cache in self.layers:
            if isinstance(cache, AttentionCache):
                return cache.capacity
        return self.mtp.capacity if self.mtp is not None else 2**31 - 1


def init_decode_state(config: ModelConfig, batch: int, capacity: int) -> DecodeState:
    """Empty state for ``batch`` sequences of at most ``capacity`` tokens each."""
    if not isinstance(batch, int) or batch < 1:
        raise ValueError(f"batch must be a positive int, got {batch!r}")
    if not isinstance(capacity, int) or capacity < 1:
        raise ValueError(f"capacity must be a positive int, got {capacity!r}")
    layers = tuple(
        AttentionCache.init(config, batch, capacity) if t == FULL else GDNCache.init(config, batch)
        for t in config.layer_types
    )
    mtp = AttentionCache.init(config, batch, capacity) if config.mtp_num_layers else None
    zeros = jnp.zeros((batch,), jnp.int32)
    return DecodeState(layers=layers, lengths=zeros, mtp=mtp, mtp_lengths=zeros)
