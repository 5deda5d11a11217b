"""The hybrid decoder and its MTP head: teacher-forced forward, prefill, one-token and window steps.

    logits = forward(config, params, tokens)                       # [b, t] -> [b, t, V], no cache
    out = window_step(config, params, state, tokens, valid=None)   # t new tokens per sequence
    out = prefill(config, params, tokens, lengths, capacity)       # right-padded ragged prompts
    out = step(config, params, state, tokens)                      # [b] -> logits [b, V]
    logits, hidden = mtp_forward(config, params, hidden, next_tokens, positions)

``config`` is static (frozen dataclass, hashable); params and state are arguments. One compile per
(config, shapes, gdn_method). The ``*_impl`` functions are the same computations unjitted and
unchecked, for use inside other jitted code (the decoding program, training losses).
"""

from __future__ import annotations

from typing import NamedTuple

import jax
import jax.numpy as jnp
import numpy as np

from mtpspec import compiled
from mtpspec.config import FULL, ModelConfig
from mtpspec.models import layers
from mtpspec.models.inference import Linear
from mtpspec.models.state import AttentionCache, DecodeState, init_decode_state
from mtpspec.models.tree import check_tree, tree_layer


class StepOutput(NamedTuple):
    logits: jax.Array | None  # [b, t, V] float32 (None when only the argmax was asked for)
    hidden: jax.Array  # [b, t, H]: final-normed hidden (what lm_head sees and the MTP head takes)
    state: DecodeState
    commit: tuple  # per layer: GDNCommit or AttentionCommit of this window (models/state.py)
    ids: jax.Array | None = None  # [b, t] int32 each row's argmax (``argmax_only``), else None


def check_tokens(config: ModelConfig, tokens, *, rank: int = 2, name: str = "tokens") -> None:
    """Type, rank and vocabulary-range checks before any device work (values checked when the
    array is concrete)."""
    if not hasattr(tokens, "dtype") or not hasattr(tokens, "shape"):
        raise TypeError(f"{name} must be an integer array, got {type(tokens).__name__}")
    if not jnp.issubdtype(tokens.dtype, jnp.integer):
        raise TypeError(f"{name} must have an integer dtype, got {tokens.dtype}")
    if tokens.ndim != rank:
        raise ValueError(f"{name} must have rank {rank}, got shape {tokens.shape}")
    if isinstance(tokens, jax.core.Tracer):
        return
    values = np.asarray(tokens)
    if values.size and (values.min() < 0 or values.max() >= config.vocab_size):
        bad = values[(values < 0) | (values >= config.vocab_size)]
        raise ValueError(
            f"{name} has ids outside the vocabulary [0, {config.vocab_size}): e.g. {int(bad[0])}"
        )


def lm_logits(config: ModelConfig, params: dict, hidden: jax.Array) -> jax.Array:
    w = params.get("lm_head")  # an inference tree always has one (models/inference.py)
    if config.tie_word_embeddings and not isinstance(w, Linear):
        w = params["embed"].T
    return layers.linear(hidden, w)


def screened_head(params) -> bool:
    """Whether a decoding tree's LM head has an int8 screen (``Linear.with_screen``): greedy rows
    can then take their argmax without the full logits (``lm_argmax``)."""
    return getattr(params.get("lm_head"), "screen", None) is not None


def lm_argmax(params: dict, hidden: jax.Array) -> jax.Array:
    """ids [...] int32 = ``ops.argmax(lm_logits(config, params, hidden))``, bit for bit, through
    the head's screen (``Linear.argmax``; ``screened_head`` must hold)."""
    return params["lm_head"].argmax(hidden)


def _run_layers(config, params, x, start, valid, caches, gdn_method, gdn_states=False, tree=None):
    """x [b, t, H] through every layer: the causal window, or with ``tree`` (a ``TreeShape``)
    every row over its own path (``models.tree.tree_layer``; its GDN runs the C++ recurrence
    where ``gdn_method`` is "ffi")."""
    new_caches, commits = [], []
    for i, p in enumerate(params["layers"]):
        cache = None if caches is None else caches[i]
        if tree is None:
            kind = (config.layer_types[i], config.mlp_types[i])
            x, cache, commit = layers.decoder_layer(
                config, kind, p, x, start, valid, cache, gdn_method, gdn_states
            )
        else:
            native = gdn_method == "ffi"
            x, cache, commit = tree_layer(
                config, config.mlp_types[i], p, x, start, valid > 0, cache, tree, native
            )
        new_caches.append(cache)
        commits.append(commit)
    return x, tuple(new_caches), tuple(commits)


def forward_impl(config: ModelConfig, params: dict, tokens, gdn_method: str = "auto"):
    """Teacher-forced (logits [b, t, V] f32, final-normed hidden [b, t, H]) for int32 tokens
    [b, t], no cache, unjitted and unchecked (training losses call it inside their own jit)."""
    b, t = tokens.shape
    x = params["embed"][tokens]
    zeros = jnp.zeros((b,), jnp.int32)
    x, _, _ = _run_layers(config, params, x, zeros, zeros + t, None, gdn_method)
    hidden = layers.norm(config, x, params["final_norm"])
    return lm_logits(config, params, hidden), hidden


_forward = compiled.jit(forward_impl, static_argnames=("config", "gdn_method"))


def forward(config: ModelConfig, params: dict, tokens, *, gdn_method: str = "auto"):
    """Teacher-forced logits [b, t, V] float32 for int tokens [b, t], no cache."""
    check_tokens(config, tokens)
    return _forward(config, params, jnp.asarray(tokens, jnp.int32), gdn_method)[0]


def forward_hidden(config: ModelConfig, params: dict, tokens, *, gdn_method: str = "auto"):
    """(logits [b, t, V], final-normed hidden [b, t, H]) for int tokens [b, t], no cache."""
    check_tokens(config, tokens)
    return _forward(config, params, jnp.asarray(tokens, jnp.int32), gdn_method)


def window_step_impl(
    config,
    params,
    state,
    tokens,
    valid,
    gdn_method,
    gdn_states=False,
    logits_at=None,
    tree=None,
    argmax_only=False,
):
    """Unjitted body of ``window_step`` (for use inside other jitted code). ``logits_at`` [b]
    (a row per sequence): the LM head runs on that row only and ``logits`` is [b, 1, V] (a
    prefill needs the last prompt row's: the head is a third of a real-size model, and a
    custom-call head cannot be sliced by XLA after the fact). ``tree``: a ``TreeShape`` whose
    rows the window holds (``models.tree``: row r at position L + depth, keys written at slots
    L + row, every GDN state per node in the commit data, the lengths as before; ``valid`` > 0
    marks the active sequences); None, or a chain (the tree of ones): the causal window.
    ``argmax_only`` (a screened head, ``screened_head``): ``ids`` holds each row's argmax and
    ``logits`` is None (a greedy program keeping no log-probabilities needs nothing else)."""
    if tree is not None and tree.is_chain:
        tree = None
    x = params["embed"][tokens]
    x, caches, commits = _run_layers(
        config, params, x, state.lengths, valid, state.layers, gdn_method, gdn_states, tree
    )
    hidden = layers.norm(config, x, params["final_norm"])
    lengths = state.lengths + valid if tree is None else state.lengths
    new_state = state._replace(layers=caches, lengths=lengths)
    rows = hidden
    if logits_at is not None:
        rows = jnp.take_along_axis(hidden, logits_at[:, None, None], axis=1)
    if argmax_only:
        return StepOutput(None, hidden, new_state, commits, lm_argmax(params, rows))
    return StepOutput(lm_logits(config, params, rows), hidden, new_state, commits)


_window_step = compiled.jit(
    window_step_impl, static_argnames=("config", "gdn_method", "gdn_states", "tree")
)


def window_step(
    config: ModelConfig,
    params: dict,
    state: DecodeState,
    tokens,
    valid=None,
    *,
    gdn_method: str = "auto",
    gdn_states: bool = False,
    tree=None,
) -> StepOutput:
    """Fold ``tokens`` [b, t] into the state at each sequence's length; ``valid`` [b] (default t)
    says how many are real (the rest is padding and leaves every cache as if absent).
    ``gdn_states``: also return every per-position GDN state in the commit data. ``tree``: a
    ``TreeShape`` (or its branching) whose rows ``tokens`` are (t = its rows; see
    ``window_step_impl``; ``valid`` 0 marks an inactive sequence)."""
    check_tokens(config, tokens)
    b, t = tokens.shape
    if b != state.lengths.shape[0]:
        raise ValueError(
            f"tokens batch {b} does not match the state's batch {state.lengths.shape[0]}"
        )
    if tree is not None:
        tree = check_tree(tree)
        if tree.rows != t:
            raise ValueError(f"tree {tree.branching} has {tree.rows} rows; tokens have {t}")
    valid = jnp.full((b,), t, jnp.int32) if valid is None else jnp.asarray(valid, jnp.int32)
    if valid.shape != (b,):
        raise ValueError(f"valid must have shape {(b,)}, got {valid.shape}")
    tokens = jnp.asarray(tokens, jnp.int32)
    return _window_step(config, params, state, tokens, valid, gdn_method, gdn_states, None, tree)


def prefill(
    config: ModelConfig,
    params: dict,
    tokens,
    lengths=None,
    *,
    capacity: int,
    gdn_method: str = "auto",
) -> StepOutput:
    """Prompts right-padded to [b, t] with true ``lengths`` [b] (default t), into a fresh state
    of ``capacity`` tokens per sequence."""
    check_tokens(config, tokens)
    b, t = tokens.shape
    if t > capacity:
        raise ValueError(f"prompt length {t} exceeds the cache capacity {capacity}")
    state = init_decode_state(config, b, capacity)
    return window_step(config, params, state, tokens, lengths, gdn_method=gdn_method)


def step(config: ModelConfig, params: dict, state: DecodeState, tokens, *, gdn_method="auto"):
    """One token per sequence: tokens [b] -> StepOutput with logits [b, 1, V]."""
    check_tokens(config, tokens, rank=1)
    return window_step(config, params, state, tokens[:, None], gdn_method=gdn_method)


# ---- MTP head -----------------------------------------------------------------------------------


def _mtp_hidden(config, params, hidden, next_tokens, start, valid, cache):
    p = params["mtp"]
    e = layers.norm(config, params["embed"][next_tokens], p["norm_embed"])
    h = layers.norm(config, hidden.astype(e.dtype), p["norm_hidden"])
    x = layers.linear(jnp.concatenate([e, h], axis=-1), p["fc"]).astype(e.dtype)
    kind = (FULL, config.mtp_mlp_type)
    x, cache, _ = layers.decoder_layer(config, kind, p["layer"], x, start, valid, cache, "auto")
    return layers.norm(config, x, p["norm"]), cache


def mtp_forward_impl(config: ModelConfig, params: dict, hidden, next_tokens, start):
    """Teacher-forced MTP head, unjitted and unchecked (see ``mtp_forward``): (logits, hidden)."""
    b, t = next_tokens.shape
    valid = jnp.full((b,), t, jnp.int32)
    y, _ = _mtp_hidden(config, params, hidden, next_tokens, start, valid, None)
    return lm_logits(config, params, y), y


_mtp_forward = compiled.jit(mtp_forward_impl, static_argnames=("config",))


def mtp_chain_impl(config: ModelConfig, params: dict, hidden, tokens, depth: int) -> list:
    """The MTP head chained ``depth`` times on its own output, teacher-forced, as the proposer
    drafts (unjitted; training losses). ``hidden`` [b, T, H]: the trunk's final-normed hidden of
    positions 0..T-1; ``tokens`` [b, T]: the tokens at those positions. Depth d's row i pairs
    depth d-1's output of row i (the trunk's h_i at d = 1) with the token at i + d, sits at
    position i + d - 1 and predicts the token at i + d + 1; its attention reads depth 1's rows
    0..i and the rows of its own chain at depths 2..d (what the MTP cache holds when the
    proposer makes draft d from row i). Returns [logits [b, T - d, V] for d = 1..depth]; depth 1
    is ``mtp_forward_impl`` of rows 0..T-2."""
    p, b, t = params["mtp"], hidden.shape[0], hidden.shape[1]
    layer = p["layer"]
    m, ctx, own, out = hidden, None, [], []
    for d in range(1, depth + 1):
        n = t - d
        e = layers.norm(config, params["embed"][tokens[:, d : d + n]], p["norm_embed"])
        h = layers.norm(config, m[:, :n].astype(e.dtype), p["norm_hidden"])
        x = layers.linear(jnp.concatenate([e, h], axis=-1), p["fc"]).astype(e.dtype)
        pos = jnp.broadcast_to(jnp.arange(n, dtype=jnp.int32)[None] + (d - 1), (b, n))

        def mixer(h, d=d, n=n, pos=pos, ctx=ctx, own=own):
            q, gate, k, v = layers.attention_inputs(config, layer["attn"], h, pos)
            if d == 1:
                o = layers.grouped_attention(q, k, v, pos, pos)
                return layers.attention_output(layer["attn"], o, gate, h.dtype), ((k, v), [])
            mine = [(ko[:, :n], vo[:, :n]) for ko, vo in own] + [(k, v)]
            own_k, own_v = (jnp.stack(z, axis=2) for z in zip(*mine))
            o = layers.chain_attention(q, ctx[0][:, :n], ctx[1][:, :n], own_k, own_v)
            return layers.attention_output(layer["attn"], o, gate, h.dtype), (ctx, mine)

        x, (ctx, own) = layers.residual_block(config, config.mtp_mlp_type, layer, x, mixer)
        m = layers.norm(config, x, p["norm"])
        out.append(lm_logits(config, params, m))
    return out


def mtp_forward(config: ModelConfig, params: dict, hidden, next_tokens, start=None):
    """Teacher-forced MTP head: row i pairs ``hidden[:, i]`` (final-normed hidden of position
    start+i) with ``next_tokens[:, i]`` (the token at position start+i+1), at rope position
    start+i, and predicts the token at start+i+2. Returns (logits [b, t, V], mtp hidden [b, t, H]).
    """
    if not config.mtp_num_layers or "mtp" not in params:
        raise ValueError("this model has no MTP head (mtp_num_layers == 0 or no 'mtp' params)")
    check_tokens(config, next_tokens, name="next_tokens")
    b, t = next_tokens.shape
    if hidden.shape != (b, t, config.hidden_size):
        raise ValueError(f"hidden must have shape {(b, t, config.hidden_size)}, got {hidden.shape}")
    start = jnp.zeros((b,), jnp.int32) if start is None else jnp.asarray(start, jnp.int32)
    return _mtp_forward(config, params, hidden, jnp.asarray(next_tokens, jnp.int32), start)


def mtp_window_hidden_impl(config, params, state: DecodeState, hidden, next_tokens, valid):
    """Cached MTP window without the LM head: rows appended to the MTP KV cache at
    ``state.mtp_lengths``. Returns (mtp hidden [b, t, H], new state); logits of any row are
    ``lm_logits(config, params, row)`` (the speculative proposer needs only one row's)."""
    y, cache = _mtp_hidden(config, params, hidden, next_tokens, state.mtp_lengths, valid, state.mtp)
    return y, state._replace(mtp=cache, mtp_lengths=state.mtp_lengths + valid)


def mtp_window_step_impl(config, params, state: DecodeState, hidden, next_tokens, valid):
    """Cached MTP window: (logits [b, t, V], mtp hidden [b, t, H], new state)."""
    y, state = mtp_window_hidden_impl(config, params, state, hidden, next_tokens, valid)
    return lm_logits(config, params, y), y, state


mtp_window_step = compiled.jit(mtp_window_step_impl, static_argnames=("config",))


__all__ = [
    "AttentionCache",
    "StepOutput",
    "check_tokens",
    "forward",
    "forward_hidden",
    "mtp_forward",
    "mtp_window_step",
    "prefill",
    "step",
    "window_step",
]
