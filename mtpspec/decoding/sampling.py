"""Token selection: greedy, and temperature / top-k / top-p / min-p sampling applied identically
everywhere (target, drafts, lossless verification).

Only one thing is static (``Sampling.greedy``, part of the compiled program's key): whether every
sequence decodes greedily, in which case the program is argmax only and draws nothing. Otherwise
the settings travel as per-sequence arrays (``Knobs``), so a sweep over temperatures, top-k, top-p,
min-p or seeds reuses one compiled program, and each row of a batch may use its own settings. A
row with temperature 0 inside a sampled program is greedy exactly: its distribution is one-hot on
the argmax, so drawing from it, and rejection sampling of drafts against it, give the argmax.

Randomness is per sequence: row i draws from its own key (``seed_keys``), folded with the step
and purpose (``Draws.fold``), so a row's output does not depend on the other rows of its batch.
"""

from __future__ import annotations

import dataclasses
import numbers
from collections.abc import Sequence
from typing import NamedTuple

import jax
import jax.numpy as jnp
import numpy as np

from mtpspec import compiled, ops


def _is_real(x) -> bool:  # Python and NumPy numbers, not bools
    return isinstance(x, numbers.Real) and not isinstance(x, bool | np.bool_)


def _is_int(x) -> bool:
    return isinstance(x, numbers.Integral) and not isinstance(x, bool | np.bool_)


def _per_row(name: str, value, n: int) -> list:
    """A scalar (every row) or a sequence of exactly n values (one per prompt)."""
    if isinstance(value, np.ndarray) and value.ndim == 0:
        value = value.item()
    if isinstance(value, Sequence | np.ndarray | jax.Array) and not isinstance(value, str):
        values = list(np.asarray(value).tolist()) if not isinstance(value, Sequence) else value
        if len(values) != n:
            raise ValueError(
                f"{name} has {len(values)} values but there are {n} prompts (give one value, "
                "or one per prompt)"
            )
        return list(values)
    return [value] * n


def check_sampling_args(temperature, top_k, top_p, min_p=0.0) -> None:
    """Python or NumPy scalars; ValueError / TypeError naming the bad one."""
    if not _is_real(temperature):
        raise TypeError(f"temperature must be a number, got {type(temperature).__name__}")
    if not float(temperature) >= 0.0 or float(temperature) == float("inf"):
        raise ValueError(f"temperature must be finite and >= 0, got {temperature}")
    if not _is_int(top_k) or top_k < 0:
        raise ValueError(f"top_k must be an int >= 0 (0 = off), got {top_k!r}")
    if not _is_real(top_p) or not 0.0 < float(top_p) <= 1.0:
        raise ValueError(f"top_p must be in (0, 1], got {top_p!r}")
    if not _is_real(min_p) or not 0.0 <= float(min_p) <= 1.0:
        raise ValueError(f"min_p must be in [0, 1] (0 = off), got {min_p!r}")


def check_seed(seed) -> int:
    """An int seed (Python or NumPy, any size) as a Python int; TypeError otherwise."""
    if not _is_int(seed):
        raise TypeError(f"seed must be an int, got {type(seed).__name__}")
    return int(seed)


def check_seeds(seed, n: int) -> list[int]:
    """One seed per prompt: a list of n ints, or one int s meaning s, s + 1, ..., s + n − 1 (so
    row i of a batch draws exactly as a single-prompt call with seed s + i)."""
    if isinstance(seed, Sequence | np.ndarray) and not isinstance(seed, str):
        seeds = _per_row("seed", seed, n)
        return [check_seed(s) for s in seeds]
    s = check_seed(seed)
    return [s + i for i in range(n)]


def seed_key(seed: int) -> jax.Array:
    """The PRNG key of a seed. Seeds in [0, 2³²) map to ``jax.random.key(seed)``; every other int
    folds its sign and each further 32-bit word in, so distinct seeds give distinct keys (JAX's
    own ``key`` keeps only the low 32 bits of a large seed without x64)."""
    key = jax.random.key(seed % 2**32)
    if 0 <= seed < 2**32:
        return key
    key = jax.random.fold_in(key, 1 if seed < 0 else 0)
    rest = abs(seed) >> 32
    while rest:
        key = jax.random.fold_in(key, rest % 2**32)
        rest >>= 32
    return key


_keys_of = compiled.jit(jax.vmap(jax.random.key))


def seed_keys(seeds: list[int]) -> jax.Array:
    """``seed_key`` of each seed, as one key array [n] (vectorised when every seed is in
    [0, 2³²), as in the usual case of a batch from one seed)."""
    if all(0 <= s < 2**32 for s in seeds):
        return _keys_of(np.asarray(seeds, np.uint32))
    return jnp.stack([seed_key(s) for s in seeds])


class Knobs(NamedTuple):
    """Per-sequence sampling settings ([b] arrays; traced, so changing them never recompiles)."""

    temperature: jax.Array  # f32; 0 = greedy for this row
    top_k: jax.Array  # i32; 0 = off
    top_p: jax.Array  # f32 in (0, 1]; 1 = off
    min_p: jax.Array  # f32 in [0, 1]; 0 = off


def knobs_for(n: int, temperature, top_k, top_p, min_p) -> tuple[Knobs, bool]:
    """Checked host arrays for n prompts (each setting a scalar or one value per prompt), and
    whether every row is greedy. ValueError / TypeError naming the bad setting and row."""
    rows = [
        _per_row(name, v, n)
        for name, v in (("temperature", temperature), ("top_k", top_k), ("top_p", top_p))
    ] + [_per_row("min_p", min_p, n)]
    for i, (t, k, p, m) in enumerate(zip(*rows, strict=True)):
        try:
            check_sampling_args(t, k, p, m)
        except (TypeError, ValueError) as e:
            raise type(e)(f"{e} (prompt {i})" if n > 1 else str(e)) from None
    knobs = Knobs(
        np.asarray(rows[0], np.float32),
        np.asarray(rows[1], np.int32),
        np.asarray(rows[2], np.float32),
        np.asarray(rows[3], np.float32),
    )
    return knobs, bool(np.all(knobs.temperature == 0.0))


def pad_knobs(knobs: Knobs, b: int) -> Knobs:
    """Rows appended up to b (a mesh's padding rows): greedy, no filters."""
    fill = (0.0, 0, 1.0, 0.0)
    return Knobs(
        *(
            np.concatenate([x, np.full(b - len(x), f, x.dtype)])
            for x, f in zip(knobs, fill, strict=True)
        )
    )


def _fold_rows(keys, data):
    return jax.vmap(jax.random.fold_in, in_axes=(0, None))(keys, data)


class Draws(NamedTuple):
    """Per-sequence randomness: a key per row and the row's settings. ``fold(i)`` derives the keys
    of a sub-purpose (a step, a draft position) the way ``jax.random.fold_in`` does for one key."""

    keys: jax.Array  # [b] typed PRNG keys
    knobs: Knobs

    def fold(self, data) -> Draws:
        return Draws(_fold_rows(self.keys, data), self.knobs)


@dataclasses.dataclass(frozen=True)
class Sampling:
    """The static sampling mode of one program: ``greedy`` (argmax, nothing drawn) or sampled
    (per-row ``Knobs``; rows with temperature 0 stay greedy exactly)."""

    greedy: bool = True

    def select(self, logits: jax.Array, draws: Draws) -> jax.Array:
        """Ids [b, ...] from logits [b, ..., V]: argmax when greedy, else one draw per row."""
        if self.greedy:
            return ops.argmax(logits)
        logp = filtered_log_probs(logits, *draws.knobs)
        return _categorical_rows(draws.keys, logp)

    def select_with_q(self, logits: jax.Array, draws: Draws) -> tuple[jax.Array, jax.Array]:
        """(ids, q) for a draft: q is the distribution the id was drawn from ([b, ..., V]), which
        lossless verification needs; an empty last axis when greedy."""
        if self.greedy:
            return self.select(logits, draws), jnp.zeros(logits.shape[:-1] + (0,), jnp.float32)
        logp = filtered_log_probs(logits, *draws.knobs)
        return _categorical_rows(draws.keys, logp), jnp.exp(logp)

    def accept(self, draws: Draws, logits, drafts, q, drafted=None):
        """Lossless rejection sampling of ``drafts`` (see ``speculative_accept``)."""
        return speculative_accept(draws.keys, logits, drafts, q, *draws.knobs, drafted=drafted)


def _categorical_rows(keys, logp):
    return jax.vmap(lambda k, lp: jax.random.categorical(k, lp, axis=-1))(keys, logp).astype(
        jnp.int32
    )


def _as_rows(value, ndim: int, dtype):
    """A scalar, or a [b] array reshaped to [b, 1, ..., 1] (``ndim`` dims) to broadcast over
    logits [b, ..., V]."""
    v = jnp.asarray(value, dtype)
    return v.reshape(v.shape + (1,) * (ndim - v.ndim)) if v.ndim else v


def filtered_log_probs(logits: jax.Array, temperature, top_k=0, top_p=1.0, min_p=0.0):
    """Log-probabilities [..., V] of the sampling distribution (−inf outside the filters).

    Settings are scalars or per-row arrays [b] for logits [b, ..., V]. In order, as transformers
    applies them: temperature (0: one-hot on the argmax, i.e. greedy), top-k (ties with the k-th
    kept), top-p over the top-k renormalised, min-p (keep p ≥ min_p · p_max). The logits are
    shifted by their maximum before the division, so a tiny temperature (1e-10) cannot overflow to
    inf − inf = NaN: it tends to greedy (ties shared) as it should. One sort serves top-k and
    top-p, and only runs when some row filters."""
    x = logits.astype(jnp.float32)
    vocab, nd = x.shape[-1], x.ndim
    t = _as_rows(temperature, nd, jnp.float32)
    k = _as_rows(top_k, nd, jnp.int32)
    p = _as_rows(top_p, nd, jnp.float32)
    m = _as_rows(min_p, nd, jnp.float32)
    iota = jax.lax.broadcasted_iota(jnp.int32, x.shape, nd - 1)
    greedy = t <= 0.0
    z = (x - jnp.max(x, axis=-1, keepdims=True)) / jnp.where(greedy, 1.0, t)
    one_hot = jnp.where(iota == ops.argmax(x)[..., None], 0.0, -jnp.inf)
    z = jnp.where(greedy, one_hot, z)
    k_eff = jnp.where((k > 0) & (k < vocab), k, vocab)

    def top_k_top_p(z):
        desc = -jnp.sort(-z, axis=-1)
        rank = jax.lax.broadcasted_iota(jnp.int32, desc.shape, nd - 1)
        in_k = rank < k_eff
        probs = jax.nn.softmax(jnp.where(in_k, desc, -jnp.inf), axis=-1)
        before = jnp.cumsum(probs, axis=-1) - probs  # mass strictly above each candidate
        keep = in_k & ((before < p) | (p >= 1.0))  # always keeps the top one
        threshold = jnp.min(jnp.where(keep, desc, jnp.inf), axis=-1, keepdims=True)
        return jnp.where(z >= threshold, z, -jnp.inf)

    filtering = jnp.any(k_eff < vocab) | jnp.any(p < 1.0)
    z = jax.lax.cond(filtering, top_k_top_p, lambda z: z, z)
    z = jnp.where(z >= jnp.log(m), z, -jnp.inf)  # the top token has z = 0 ≥ log(min_p)
    return jax.nn.log_softmax(z, axis=-1)


def select_tokens(logits: jax.Array, key, temperature, top_k=0, top_p=1.0, min_p=0.0):
    """Greedy (temperature 0) or sampled ids [...] from logits [..., V] with one key."""
    logp = filtered_log_probs(logits, temperature, top_k, top_p, min_p)
    return jax.random.categorical(key, logp, axis=-1).astype(jnp.int32)


def speculative_accept(
    key,
    logits: jax.Array,  # [b, k + 1, V] target logits over the window
    drafts: jax.Array,  # [b, k] drafted ids
    q: jax.Array,  # [b, k, V] the proposer's probabilities the drafts were sampled from
    temperature,
    top_k=0,
    top_p=1.0,
    min_p=0.0,
    *,
    residual: bool = True,
    drafted=None,
):
    """Lossless rejection sampling of a chain (Leviathan et al. 2023; Chen et al. 2023): the
    chain's window (the tree of ones) through ``tree_speculative_accept``.

    Draft d_i is accepted with probability min(1, p_i(d_i) / q_i(d_i)) (as u·q < p, no division);
    a = number of leading acceptances. At the first rejection the new token is drawn from
    normalize(max(0, p_a − q_a)); when all k are accepted, from p_k (the bonus). p and q use the
    same settings (scalars or per row). ``key``: one key, or one per row ([b]). Returns
    (a [b] int32, new token [b] int32). A greedy row (temperature 0, q one-hot on its drafts)
    accepts exactly the drafts equal to the argmax and then takes the argmax.
    ``residual=False`` resamples from p_a instead: a deliberately WRONG rule, kept only as the
    statistical test's negative control. ``drafted`` [b] (None: k): a row drafted only its
    first ``drafted`` positions (the rest are ignored); a row that accepts all of them draws its
    bonus from p at that row.
    """
    from mtpspec.models.tree import TreeShape

    b, k = drafts.shape
    keys = key if key.ndim == 1 else jax.random.split(key, b)
    tokens = jnp.concatenate([jnp.zeros_like(drafts[:, :1]), drafts], axis=1)  # root unused
    node, token = tree_speculative_accept(
        keys, logits, tokens, q, TreeShape.chain(k), temperature, top_k, top_p, min_p,
        residual=residual, drafted=drafted,
    )  # fmt: skip
    return node, token  # a chain's accepted row is its count of accepted drafts


def sample_rows(keys, logp) -> jax.Array:
    """One draw per row key from log-probabilities [b, ..., V] (independent per element)."""
    return _categorical_rows(keys, logp)


def tree_speculative_accept(keys, logits, tokens, q, tree, temperature, top_k=0, top_p=1.0,
                            min_p=0.0, *, residual: bool = True, drafted=None):  # fmt: skip
    """Lossless multi-candidate verification of a draft window, chain or tree (SpecInfer's
    multi-step speculative sampling; Miao et al. 2024, also Sequoia): walking down from the
    root, the children of the current node are tried in turn; child x, drawn from q_x, is
    accepted with probability min(1, r(x) / q_x(x)), where r starts as the target's p at the
    node and after each rejection becomes normalize(max(0, r − q_x)). An accepted child becomes
    the current node; when all are rejected the new token is drawn from r; at a leaf, from p
    there (the bonus). Lossless when siblings are drawn i.i.d. from one q (a sampled MTP tree)
    or are distinct deterministic candidates with q_x one-hot on x (n-gram continuations). A
    chain (every node one child) is Leviathan et al.'s rule.

    logits [b, R, V] (target, every window row), tokens [b, R] (row 0 the root), q [b, R − 1, V]
    (the distribution each draft row's token was drawn from, rows 1..), ``tree`` a TreeShape,
    ``keys`` one per row. ``drafted`` [b] (None: every depth): a sequence drafted only depths
    1..drafted; past them it stops at its node and draws the bonus from p there. Returns
    (node [b] the accepted row, new token [b]); the accepted drafts are ``tree.row_depth[node]``.
    ``residual=False`` keeps r = p after a rejection: a deliberately WRONG rule, kept only as
    the statistical test's negative control."""
    b = logits.shape[0]
    p = jnp.exp(filtered_log_probs(logits, temperature, top_k, top_p, min_p))  # [b, R, V]
    rows = jnp.arange(b)
    first_child = jnp.asarray(tree.first_child)
    cur = jnp.zeros((b,), jnp.int32)
    alive = jnp.ones((b,), bool)  # every node so far accepted
    stop_dist = p[:, 0]

    def uniform(depth, j):  # one independent draw per (depth, child) and row
        fold = jax.random.fold_in
        return jax.vmap(lambda k: jax.random.uniform(fold(fold(k, depth), j)))(keys)

    for depth, branching in enumerate(tree.branching):
        walking = alive if drafted is None else alive & (depth < drafted)
        r = p[rows, cur]  # [b, V]
        nxt, found = cur, jnp.zeros((b,), bool)
        for j in range(branching):
            child = first_child[cur] + j
            x, qd = tokens[rows, child], q[rows, child - 1]
            u = uniform(depth, j)
            trying = walking & ~found
            ok = trying & (u * qd[rows, x] < r[rows, x])
            nxt = jnp.where(ok, child, nxt)
            if residual:
                left = jnp.maximum(r - qd, 0.0)
                total = jnp.sum(left, axis=-1, keepdims=True)
                left = jnp.where(total > 0, left / jnp.where(total > 0, total, 1.0), r)
                r = jnp.where((trying & ~ok)[:, None], left, r)
            found = found | ok
        rejected = walking & ~found
        stop_dist = jnp.where(rejected[:, None], r, stop_dist)
        alive = alive & ~rejected  # a row past its drafts stays alive at its node (the bonus)
        cur = nxt
    final = jnp.where(alive[:, None], p[rows, cur], stop_dist)
    final_keys = jax.vmap(lambda k: jax.random.fold_in(k, tree.depth))(keys)
    token = _categorical_rows(final_keys, jnp.log(final))
    return cur, token
