"""Drafting that adapts, exactly: how many of the k drafts each sequence puts in this step's
verify window (``SpecConfig.p_min`` / ``SpecConfig.adaptive``).

Per step, a sequence drafts position i (0-based) only while
  - i < its own draft length ``k_cap`` (the adaptive policy's choice, else k), and
  - the draft distribution's largest probability at every position up to i is at least p_min
    (``conf``: the model's own softmax at temperature 1, llama.cpp's ``--spec-draft-p-min``).
Both read only what is known before draft i is drawn (the drafts before it, earlier steps), so the
number of drafts is a stopping time: verification of each drafted position stays lossless and
greedy stays plain greedy. (Dropping draft i because of its *own* sampled probability q(d_i)
would not be: it conditions the draft on the set it fell in, and rejection sampling against q
then skews the output.)

The window holds [pending, d_1..d_m] with m the largest count over the batch; it runs at one of
the lengths 1..k + 1 chosen by ``lax.switch`` (every length is compiled once into the program),
its outputs padded back to k + 1 rows (padding: zeros, never read: every row's n ≤ its m + 1).

The adaptive policy (per sequence): an exponential average of accepted drafts per step (weight
``EMA_WEIGHT``); the draft length moves up by one when the average reaches k_cap − 0.5 +
``HYSTERESIS`` (nearly every draft offered was taken) and down by one when it falls to
k_cap − 1.5 − ``HYSTERESIS`` (SGLang's round(ema) + 1 target with a dead band), within
1..num_draft. It starts at num_draft.
"""

from __future__ import annotations

from typing import NamedTuple

import jax
import jax.numpy as jnp

EMA_WEIGHT = 0.25
HYSTERESIS = 0.1


class DraftLimits(NamedTuple):
    """The call's adaptive settings as arrays (changing them never recompiles)."""

    p_min: jax.Array  # [] float32 (0: no cut)
    adaptive: jax.Array  # [] bool: the per-sequence draft-length policy is on


class Policy(NamedTuple):
    """Per-sequence draft length and its running average (part of the loop carry)."""

    k_cap: jax.Array  # [b] int32 drafts this sequence may put in a window (1..k)
    ema: jax.Array  # [b] float32 exponential average of accepted drafts per step


def init_policy(b: int, k: int) -> Policy:
    return Policy(jnp.full((b,), k, jnp.int32), jnp.full((b,), float(k), jnp.float32))


def max_prob(logits: jax.Array) -> jax.Array:
    """[b, V] -> [b]: the largest probability of softmax(logits) (temperature 1, unfiltered)."""
    x = logits.astype(jnp.float32)
    return jnp.exp(jnp.max(x, axis=-1) - jax.nn.logsumexp(x, axis=-1))


def draft_count(conf: jax.Array | None, k: int, limits: DraftLimits, policy: Policy, active):
    """m [b] int32: drafts each row puts in the window (0 for finished rows). ``conf`` [b, k]
    (None: the proposer has no probabilities, e.g. n-gram lookup: p_min does not cut)."""
    if conf is None:
        lead = jnp.full(active.shape, k, jnp.int32)
    else:
        keep = (conf >= limits.p_min).astype(jnp.int32)
        lead = jnp.sum(jnp.cumprod(keep, axis=1), axis=1).astype(jnp.int32)
    return jnp.where(active, jnp.minimum(lead, policy.k_cap), 0)


def update_policy(policy: Policy, limits: DraftLimits, k: int, accepted, m, active) -> Policy:
    """Fold this step's accepted drafts into rows that offered any; move k_cap with hysteresis
    (only where the policy is on)."""
    seen = active & (m > 0)
    ema = jnp.where(seen, (1 - EMA_WEIGHT) * policy.ema + EMA_WEIGHT * accepted, policy.ema)
    cap = policy.k_cap
    up = (ema >= cap - 0.5 + HYSTERESIS) & (cap < k)
    down = (ema <= cap - 1.5 - HYSTERESIS) & (cap > 1)
    step = up.astype(jnp.int32) - down.astype(jnp.int32)
    cap = jnp.where(limits.adaptive & seen, cap + step, cap)
    return Policy(cap, ema)


def pad_rows(tree, rows: int):
    """Every leaf's axis 1 zero-padded to ``rows`` (window outputs: logits, hidden, commit data)."""

    def pad(x):
        if x.shape[1] == rows:
            return x
        widths = [(0, 0)] * x.ndim
        widths[1] = (0, rows - x.shape[1])
        return jnp.pad(x, widths)

    return jax.tree.map(pad, tree)


def switch_window(length, run_window, k: int, *operands):
    """``run_window(t, *operands)`` for the window length t = ``length`` ([] int32 in 1..k + 1),
    each length compiled once as a ``lax.switch`` branch. ``run_window`` returns its outputs
    padded to k + 1 rows."""
    branches = [lambda *ops, t=t: run_window(t, *ops) for t in range(1, k + 2)]
    index = jnp.clip(length - 1, 0, k)
    return jax.lax.switch(index, branches, *operands)
