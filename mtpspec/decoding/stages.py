"""The stages of one verify step, each a pure function of arrays (jit-traceable, static shapes).

    propose   the proposer's k drafts (``proposers``)
    verify    one target forward over the window [pending, d_1..d_k]: k + 1 logits, hidden states,
              the state after the whole window and the per-layer commit data
    accept    a = accepted drafts (greedy: longest prefix equal to the target's argmax; sampling:
              lossless rejection sampling) and the new token (correction, or bonus when a = k)
    commit    the state holding exactly the first n = a + 1 window positions
    emit      write d_1..d_a and the new token to the output, apply EOS / max_new_tokens
    update    the proposer folds in what was accepted (``proposers``)

``s`` is the program key (``program.ProgramKey``).
"""

from __future__ import annotations

from typing import NamedTuple

import jax
import jax.numpy as jnp

from mtpspec.decoding import adaptive
from mtpspec.decoding.commit import commit_window
from mtpspec.models.decoder import StepOutput, window_step_impl
from mtpspec.models.state import DecodeState

RUNNING, STOP_EOS, STOP_LENGTH, STOP_CAPACITY = 0, 1, 2, 3
STOP_NAMES = {STOP_EOS: "eos", STOP_LENGTH: "length", STOP_CAPACITY: "capacity"}


def verify(s, params, state: DecodeState, pending, drafts, active, m=None) -> StepOutput:
    """Fold [pending, d_1..d_k] into ``state`` (finished sequences: nothing) in one forward.
    ``m`` [b] (adaptive programs): each row's drafts in the window; the window runs at
    1 + max(m) rows (``adaptive.switch_window``) and its outputs are padded to k + 1 rows."""
    window = jnp.concatenate([pending[:, None], drafts], axis=1)  # [b, k + 1]
    keep_states = s.commit == "states"
    if m is None:
        valid = jnp.where(active, s.k + 1, 0).astype(jnp.int32)
        return window_step_impl(
            s.config, params, state, window, valid, s.verify_method, keep_states
        )
    valid = jnp.where(active, m + 1, 0).astype(jnp.int32)

    def run_window(t, window, valid, state):
        out = window_step_impl(
            s.config, params, state, window[:, :t], valid, s.verify_method, keep_states
        )
        rows = s.k + 1
        return out._replace(
            logits=adaptive.pad_rows(out.logits, rows),
            hidden=adaptive.pad_rows(out.hidden, rows),
            commit=adaptive.pad_rows(out.commit, rows),
        )

    return adaptive.switch_window(1 + jnp.max(m), run_window, s.k, window, valid, state)


def accept(s, draws, logits, drafts, q, m=None) -> tuple[jax.Array, jax.Array]:
    """(a [b] accepted drafts, new token [b]) from the window's logits [b, k + 1, V]. ``m`` [b]
    (adaptive programs): only the first m drafts of a row were drafted; a ≤ m, and a row that
    accepts all m takes its bonus token from row m."""
    if s.k and not s.sampling.greedy:  # lossless rejection sampling
        return s.sampling.accept(draws, logits, drafts, q, m)
    target = s.sampling.select(logits, draws)  # [b, k + 1] (plain sampling when k = 0)
    same = (drafts == target[:, : s.k]).astype(jnp.int32)
    accepted = jnp.sum(jnp.cumprod(same, axis=1), axis=1).astype(jnp.int32)
    if m is not None:
        accepted = jnp.minimum(accepted, m)
    return accepted, jnp.take_along_axis(target, accepted[:, None], axis=1)[:, 0]


def commit(s, snapshot: DecodeState, verified: StepOutput, n) -> DecodeState:
    """The target state after exactly the first ``n`` [b] window positions."""
    if not s.k:  # plain decoding: the window is exactly the accepted prefix
        return verified.state
    native = s.verify_method == "ffi"  # the window's GDN ran the C++ kernel: so does "replay"
    return commit_window(snapshot, verified.state, verified.commit, n, s.commit, native)


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
    """KV slots one verify window writes: k + 1 for a chain, every node of a tree."""
    return s.k + 1 if s.tree is None else s.tree.rows


def check_capacity(s, lengths, stop):
    """Stop sequences whose next verify window would not fit (never wrap around)."""
    full = lengths + window_rows(s) > s.capacity
    return jnp.where((stop == RUNNING) & full, STOP_CAPACITY, stop)
