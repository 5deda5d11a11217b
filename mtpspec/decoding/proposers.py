"""Draft proposers, on device, static shapes.

- n-gram prompt lookup over each sequence's own history (prompt + emitted tokens);
- MTP: the model's MTP module, caught up on the accepted window and chained for k > 1 (the module
  re-applied to its own hidden output, as vLLM does), its KV cache rolled back by length.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp

from mtpspec.models.decoder import mtp_window_step_impl, window_step_impl
from mtpspec.models.state import DecodeState
from mtpspec.ops import GDNAux


def ngram_propose(
    hist: jax.Array,  # [b, n] int32: prompt + emitted tokens (pending included)
    hist_len: jax.Array,  # [b] int32
    k: int,
    n_min: int,
    n_max: int,
) -> jax.Array:  # [b, k] int32
    """Find the latest earlier occurrence of the history's last n tokens (longest n in
    n_max..n_min first) and propose the k tokens that followed it. Positions past the history and
    sequences with no match propose the last token (drafts must only be valid ids; a bad draft
    costs acceptance, never correctness)."""
    b, size = hist.shape
    pos = jnp.arange(size)[None, :]  # candidate match end p (the match is hist[p−n+1 .. p])
    last = hist_len - 1  # index of the pending token
    tail = lambda j: jnp.take_along_axis(hist, jnp.maximum(last - j, 0)[:, None], 1)  # noqa: E731
    best = jnp.full((b,), -1, jnp.int32)
    eq_all = jnp.ones((b, size), bool)
    for j in range(n_max):
        shifted = jnp.roll(hist, j, axis=1)  # shifted[p] = hist[p − j]
        eq_all = eq_all & (shifted == tail(j)) & (pos - j >= 0)
        n = j + 1
        if n >= n_min:
            ok = eq_all & (pos < last[:, None])  # earlier than the suffix itself
            cand = jnp.max(jnp.where(ok, pos, -1), axis=1).astype(jnp.int32)
            best = jnp.where(cand >= 0, cand, best)  # longer n (later j) overrides shorter
    idx = best[:, None] + 1 + jnp.arange(k)[None, :]
    fallback = jnp.take_along_axis(hist, last[:, None], 1)
    ok = (best[:, None] >= 0) & (idx <= last[:, None])
    drafts = jnp.take_along_axis(hist, jnp.clip(idx, 0, size - 1), 1)
    return jnp.where(ok, drafts, fallback).astype(jnp.int32)


def mtp_catch_up_and_draft(
    config,
    params,
    state: DecodeState,
    hidden: jax.Array,  # [b, t, H] target hidden of the window (rows 0..n−1 accepted)
    next_tokens: jax.Array,  # [b, t] token following each row (accepted drafts, then the new one)
    n: jax.Array,  # [b] rows to fold into the MTP cache
    k: int,
    select,  # (logits [b, V], salt) -> (ids [b], q [b, V or 0])
):
    """Fold the accepted rows into the MTP cache, then draft k tokens.

    Row n−1 pairs the last accepted hidden with the newly emitted token and predicts draft 1;
    drafts 2..k chain the MTP module on its own output hidden on a throw-away copy of the cache
    (the kept state is the caught-up one). Returns (drafts [b, k], caught-up state)."""
    logits, y, state = mtp_window_step_impl(config, params, state, hidden, next_tokens, n)
    row = jnp.clip(n - 1, 0, hidden.shape[1] - 1)[:, None, None]
    last_logits = jnp.take_along_axis(logits, row, axis=1)[:, 0]
    h = jnp.take_along_axis(y, row, axis=1)  # [b, 1, H]
    picked = [select(last_logits, 0)]
    tmp = state
    one = jnp.ones_like(n)
    for i in range(1, k):
        logits_i, h, tmp = mtp_window_step_impl(config, params, tmp, h, picked[-1][0][:, None], one)
        picked.append(select(logits_i[:, 0], i))
    drafts = jnp.stack([d for d, _ in picked], axis=1)
    q = jnp.stack([q for _, q in picked], axis=1)
    return drafts, q, state


def _stack_commits(steps: list[tuple]) -> tuple:
    """Per-layer commit data of t one-token passes, joined as if from one t-token window."""
    joined = []
    for per_layer in zip(*steps, strict=True):
        if per_layer[0] is None:
            joined.append(None)
            continue
        cat = {
            key: jnp.concatenate([c[key] for c in per_layer], axis=1)
            for key in ("conv_in", "k", "v", "g", "beta")
        }
        states = per_layer[0]["aux"].states
        aux = GDNAux(
            u=jnp.concatenate([c["aux"].u for c in per_layer], axis=1),
            g_cum=jnp.cumsum(cat["g"], axis=1),
            states=None
            if states is None
            else jnp.concatenate([c["aux"].states for c in per_layer], axis=1),
        )
        joined.append({**cat, "aux": aux})
    return tuple(joined)


def draft_model_propose(
    dconfig,
    dparams,
    dstate: DecodeState,  # the draft model's state: every emitted token but the pending one
    pending: jax.Array,  # [b]
    active: jax.Array,  # [b] bool: finished sequences do not move
    k: int,
    select,  # (logits [b, V], salt) -> (ids [b], q [b, V or 0])
    gdn_states: bool,
):
    """Draft k tokens autoregressively with a separate model, feeding [pending, d_1..d_k] (k + 1
    one-token steps, so that an all-accepted window is folded in too).

    Returns (drafts [b, k], q [b, k, V or 0], state after the k + 1 tokens, commit data of those
    k + 1 positions): the caller commits the draft state to the accepted prefix with the same
    strategies as the target (``commit_window(dstate, after, commits, n, strategy)``)."""
    valid = active.astype(jnp.int32)
    token = pending
    state = dstate
    picked, commits = [], []
    for i in range(k + 1):
        out = window_step_impl(
            dconfig, dparams, state, token[:, None], valid, "recurrent", gdn_states
        )
        state = out.state
        commits.append(out.commit)
        if i < k:
            picked.append(select(out.logits[:, 0], i))
            token = picked[-1][0]
    drafts = jnp.stack([d for d, _ in picked], axis=1)
    q = jnp.stack([q for _, q in picked], axis=1)
    return drafts, q, state, _stack_commits(commits)
