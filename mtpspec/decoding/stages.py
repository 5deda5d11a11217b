"""The stages of one verify step, each a pure function of arrays (jit-traceable, static shapes).

    propose   the proposer's drafts: the rows of the window after the pending token (``proposers``)
    verify    one target forward over the window (``window``: a chain [pending, d_1..d_k] or a
              tree): a logit row per window row, hidden states, the state after the window and
              the per-layer commit data
    accept    the accepted row (greedy: the deepest whose path equals the target's argmax;
              sampling: lossless rejection sampling) and the new token (correction, or bonus);
              a = its depth drafts accepted
    commit    the state holding exactly the accepted path, n = a + 1 positions
    emit      write d_1..d_a and the new token to the output, apply EOS / max_new_tokens
    update    the proposer folds in what was accepted (``proposers``)

``s`` is the program key (``program.ProgramKey``).
"""

from __future__ import annotations

from typing import NamedTuple

import jax
import jax.numpy as jnp

from mtpspec.decoding import adaptive, window
from mtpspec.decoding.commit import commit_window
from mtpspec.decoding.sampling import tree_speculative_accept
from mtpspec.models.decoder import StepOutput, screened_head, window_step_impl
from mtpspec.models.state import DecodeState

RUNNING, STOP_EOS, STOP_LENGTH, STOP_CAPACITY = 0, 1, 2, 3
STOP_NAMES = {STOP_EOS: "eos", STOP_LENGTH: "length", STOP_CAPACITY: "capacity"}


def argmax_only(s, params) -> bool:
    """Whether program ``s`` needs only each window row's argmax from the target's head: greedy,
    no log-probabilities kept, and a screened head (``decoder.screened_head``), which gives the
    argmax — the same ids — streaming about half a bf16 head's bytes."""
    return s.sampling.greedy and not s.logprobs and screened_head(params)


def verify(s, params, state: DecodeState, pending, drafts, active, m=None) -> StepOutput:
    """Fold the window [pending, drafts] into ``state`` (finished sequences: nothing) in one
    forward. A chain runs the causal window (its GDN form ``s.backend.verify``: the C++ kernel,
    chunked or recurrent); a tree runs every node over its own path (``models.tree``; keys at
    slots L + row, lengths as before). ``m`` [b] (adaptive chains): each row's drafts; the
    window runs at 1 + max(m) rows (``adaptive.switch_window``), its outputs padded to k + 1.
    Where ``argmax_only`` holds, the output's ``ids`` replace its logits."""
    tokens = jnp.concatenate([pending[:, None], drafts], axis=1)  # [b, R]
    w = window.window(s)
    keep_states = s.commit == "states"
    ids_only = argmax_only(s, params)
    if m is None:
        # a tree window's GDN runs the C++ kernel where a chain's would (or raises OSError)
        valid = jnp.where(active, tokens.shape[1], 0).astype(jnp.int32)
        return window_step_impl(
            s.config,
            params,
            state,
            tokens,
            valid,
            s.backend.verify,
            keep_states,
            tree=w,
            argmax_only=ids_only,
        )
    valid = jnp.where(active, m + 1, 0).astype(jnp.int32)

    def run_window(t, tokens, valid, state):
        out = window_step_impl(
            s.config,
            params,
            state,
            tokens[:, :t],
            valid,
            s.backend.verify,
            keep_states,
            argmax_only=ids_only,
        )
        rows = s.k + 1
        return out._replace(
            logits=adaptive.pad_rows(out.logits, rows),
            hidden=adaptive.pad_rows(out.hidden, rows),
            commit=adaptive.pad_rows(out.commit, rows),
            ids=adaptive.pad_rows(out.ids, rows),
        )

    return adaptive.switch_window(1 + jnp.max(m), run_window, s.k, tokens, valid, state)


def accept(s, draws, logits, pending, drafts, q, m=None, ids=None) -> tuple[jax.Array, jax.Array]:
    """(node [b] the accepted window row, new token [b]) from the window's logits [b, R, V]:
    greedy, the deepest row whose path matches the target's argmax (``window.accept_greedy``;
    ``ids`` [b, R]: those argmaxes, given instead of the logits where ``argmax_only``);
    sampling, lossless rejection sampling down the window (``sampling.tree_speculative_accept``)
    with the drafts' q [b, R − 1, V]. The accepted drafts are the node's depth (a chain's node is
    its count). ``m`` [b] (adaptive chains): a row drafted only its first m; it accepts at most
    those, and one that accepts all takes its bonus token at row m."""
    w = window.window(s)
    if w is None:  # plain decoding: the next token at the pending row
        token = ids[:, 0] if ids is not None else s.sampling.select(logits[:, 0], draws)
        return jnp.zeros_like(pending), token
    tokens = jnp.concatenate([pending[:, None], drafts], axis=1)
    if s.sampling.greedy:
        return window.accept_greedy(w, logits, tokens, m, ids=ids)
    return tree_speculative_accept(draws.keys, logits, tokens, q, w, *draws.knobs, drafted=m)


def commit(s, snapshot: DecodeState, verified: StepOutput, node, n) -> DecodeState:
    """The target state after exactly the path root..``node`` [b] of the window, ``n`` [b]
    positions (0: none, an inactive sequence): a chain's first n rows in place, a tree's path
    gathered (``commit.commit_window``)."""
    w = window.window(s)
    if w is None:  # plain decoding: the window is exactly the accepted prefix
        return verified.state
    rows = window.kept_rows(w, node)
    return commit_window(
        snapshot, verified.state, verified.commit, n, s.commit, s.backend.native, rows
    )


def depth(s, node) -> jax.Array:
    """[b] drafts accepted: the depth of each accepted row (a chain's row is its depth)."""
    w = window.window(s)
    if w is None or w.is_chain:
        return node
    return jnp.asarray(w.row_depth)[node]


def path_drafts(s, node, pending, drafts) -> jax.Array:
    """[b, d] the drafts on each accepted node's path (a chain's as they are)."""
    rows = window.kept_rows(window.window(s), node)
    if rows is None:
        return drafts
    return window.along(jnp.concatenate([pending[:, None], drafts], axis=1), rows)[:, 1:]


def along_path(s, node, x):
    """x [b, R, ...] (a window row each) -> [b, depth + 1, ...] along each accepted node's path
    (a chain's rows as they are)."""
    rows = window.kept_rows(window.window(s), node)
    return x if rows is None else window.along(x, rows)


class Emitted(NamedTuple):
    out: jax.Array  # [b, out_size] output buffer with this step's tokens written
    count: jax.Array  # [b] tokens emitted so far
    stop: jax.Array  # [b] RUNNING or a stop code
    tokens: jax.Array  # [b, k + 1] d_1..d_a then the new token (the token after each window row)
    index: jax.Array  # [b, k + 1] the output slot each written token went to (out_size: none)


def is_eos(tokens, eos) -> jax.Array:
    """tokens [...] int32 equal to any of the ids in ``eos`` [E] (−1 pads the list)."""
    return jnp.any(tokens[..., None] == eos, axis=-1)


def write_rows(s, buf, values, index):
    """``buf`` [b, out_size] with ``values`` [b, k + 1] written at ``index`` (out of range:
    dropped)."""
    b = buf.shape[0]
    return buf.at[jnp.arange(b)[:, None], index].set(values, mode="drop")


def emit(s, out, count, stop, drafts, accepted, token, n, max_new, eos) -> Emitted:
    """Write this step's n tokens (fewer at the first EOS id — included — or at
    max_new_tokens)."""
    active = stop == RUNNING
    j = jnp.arange(s.k + 1)[None, :]
    tokens = jnp.where(
        j < accepted[:, None], jnp.concatenate([drafts, token[:, None]], axis=1), token[:, None]
    )
    hits = is_eos(tokens, eos) & (j < n[:, None])
    first_eos = jnp.min(jnp.where(hits, j, s.k + 1), axis=1)
    hit_eos = first_eos <= s.k
    m = jnp.where(hit_eos, first_eos + 1, n)
    room = max_new - count
    hit_len = m >= room
    m = jnp.minimum(m, room)
    idx = jnp.where(j < m[:, None], count[:, None] + j, s.out_size)  # out of range = dropped
    out = write_rows(s, out, tokens, idx)
    stop = jnp.where(active & hit_eos, STOP_EOS, jnp.where(active & hit_len, STOP_LENGTH, stop))
    return Emitted(out, count + m, stop, tokens, idx)


def window_rows(s) -> int:
    """KV slots one verify window writes: every row (k + 1 for a chain)."""
    w = window.window(s)
    return 1 if w is None else w.rows


def check_capacity(s, lengths, stop):
    """Stop sequences whose next verify window would not fit (never wrap around)."""
    full = lengths + window_rows(s) > s.capacity
    return jnp.where((stop == RUNNING) & full, STOP_CAPACITY, stop)
