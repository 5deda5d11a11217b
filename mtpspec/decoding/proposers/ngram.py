"""n-gram prompt lookup over each sequence's own history (prompt + emitted tokens), on device.

The worked example of docs/design.md ("Adding a proposer"): its per-sequence state is the token
history; ``init`` writes the prompt and the first token, ``update`` appends what each step
emitted, ``propose`` looks the history's last n tokens up in the history itself.
"""

from __future__ import annotations

import dataclasses
from typing import ClassVar, NamedTuple

import jax
import jax.numpy as jnp

from mtpspec.decoding.proposers.base import Committed, Prefilled, Proposal, Proposer, register
from mtpspec.decoding.window import window
from mtpspec.models.tree import TreeShape


def match_ends(hist, hist_len, n_min: int, n_max: int) -> jax.Array:
    """[b, size] bool: the ends p of the earlier occurrences of the history's last n tokens, for
    the longest n in n_max..n_min that occurs (a longer n overrides a shorter one)."""
    b, size = hist.shape
    pos = jnp.arange(size)[None, :]  # candidate match end p (the match is hist[p−n+1 .. p])
    last = hist_len - 1
    found = jnp.zeros((b, size), bool)
    eq_all = jnp.ones((b, size), bool)
    for j in range(n_max):
        shifted = jnp.roll(hist, j, axis=1)  # shifted[p] = hist[p − j]
        tail = jnp.take_along_axis(hist, jnp.maximum(last - j, 0)[:, None], 1)
        eq_all = eq_all & (shifted == tail) & (pos - j >= 0)
        if j + 1 >= n_min:
            ok = eq_all & (pos < last[:, None])  # earlier than the suffix itself
            found = jnp.where(jnp.any(ok, axis=1, keepdims=True), ok, found)
    return found


def ngram_propose(
    hist: jax.Array,  # [b, n] int32: prompt + emitted tokens (pending included)
    hist_len: jax.Array,  # [b] int32
    k: int,
    n_min: int,
    n_max: int,
) -> jax.Array:  # [b, k] int32
    """Find the latest earlier occurrence of the history's last n tokens (longest n in
    n_max..n_min first) and propose the k tokens that followed it: ``ngram_tree_propose`` on the
    chain's window (along one branch, the latest occurrence whose continuation matches so far
    is the latest occurrence). Positions past the history and sequences with no match propose
    the last token (drafts must only be valid ids; a bad draft costs acceptance, never
    correctness)."""
    return ngram_tree_propose(hist, hist_len, TreeShape.chain(k), n_min, n_max)


def ngram_tree_propose(hist, hist_len, tree, n_min: int, n_max: int) -> jax.Array:
    """Drafts [b, R − 1] of a window ``tree`` (a chain: the tree of ones) from the history's
    own continuations: the children of a node are the distinct tokens that followed its context
    (the matched suffix, then the node's path) in the history, most recent occurrence first, b_i
    of them; a node with fewer distinct continuations fills its other children with the
    history's last (pending) token, which may repeat a sibling (a wasted node costs acceptance,
    never correctness)."""
    b, size = hist.shape
    pos = jnp.arange(size)[None, :]
    last = hist_len - 1
    fallback = jnp.take_along_axis(hist, last[:, None], 1)  # [b, 1]
    cand = match_ends(hist, hist_len, n_min, n_max)[:, None, :]  # [b, nodes of a depth, size]
    levels = []
    for i, width in enumerate(tree.branching):
        at = pos + i + 1  # the token i + 1 after a match end
        nxt = jnp.take_along_axis(hist, jnp.minimum(at, size - 1), 1)  # [b, size]
        live = cand & (at <= last[:, None])[:, None, :]
        left, picks = live, []
        for _ in range(width):
            score = jnp.where(left, pos[:, None, :], -1)
            latest = jnp.argmax(score, axis=-1)  # [b, n]
            token = jnp.take_along_axis(nxt, latest, 1)
            token = jnp.where(jnp.max(score, axis=-1) >= 0, token, fallback)
            picks.append(token)
            left = left & (nxt[:, None, :] != token[..., None])
        children = jnp.stack(picks, axis=-1).reshape(b, -1)  # [b, n · width]
        levels.append(children)
        cand = jnp.repeat(live, width, axis=1) & (nxt[:, None, :] == children[..., None])
    return jnp.concatenate(levels, axis=1).astype(jnp.int32)


class NgramState(NamedTuple):
    hist: jax.Array  # [b, capacity + 1] int32: prompt + emitted tokens, the pending one included


@register
@dataclasses.dataclass(frozen=True)
class NgramProposer(Proposer):
    name: ClassVar[str] = "ngram"
    n_min: int = 1
    n_max: int = 3

    @classmethod
    def check(cls, spec, config, params) -> None:
        lo, hi = spec.ngram_min, spec.ngram_max
        ints = all(isinstance(x, int) and not isinstance(x, bool) for x in (lo, hi))
        if not (ints and 1 <= lo <= hi):
            raise ValueError(f"need 1 <= ngram_min <= ngram_max, got {lo}, {hi}")

    @classmethod
    def from_spec(cls, spec) -> NgramProposer:
        return cls(spec.ngram_min, spec.ngram_max)

    def init(self, s, params, pparams, pre: Prefilled, key):
        b, p = pre.prompts.shape
        m = min(p, s.capacity + 1)  # the bucket-padded prompt may be longer than the history
        hist = jnp.zeros((b, s.capacity + 1), jnp.int32).at[:, :m].set(pre.prompts[:, :m])
        return NgramState(hist.at[jnp.arange(b), pre.lengths].set(pre.first)), pre.state

    def propose(
        self, s, params, pparams, pstate, state, pending, active, key, budget=None
    ) -> Proposal:
        hist_len = state.lengths + 1
        w = window(s)
        drafts = ngram_tree_propose(pstate.hist, hist_len, w, self.n_min, self.n_max)
        if s.sampling.greedy:
            q = jnp.zeros(drafts.shape + (0,), jnp.float32)
        else:  # deterministic drafts: q is one-hot on the draft
            q = jax.nn.one_hot(drafts, s.config.vocab_size, dtype=jnp.float32)
        return Proposal(drafts, q)

    def update(self, s, params, pparams, pstate, scratch, done: Committed, key):
        b, t = done.emitted.shape
        j = jnp.arange(t)[None, :]
        start = done.state.lengths - done.n + 1  # where the window's first emitted token goes
        idx = jnp.where(j < done.n[:, None], start[:, None] + j, s.capacity + 1)
        hist = pstate.hist.at[jnp.arange(b)[:, None], idx].set(done.emitted, mode="drop")
        return NgramState(hist), done.state
