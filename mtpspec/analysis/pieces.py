"""The cost of each piece of one speculative step, each timed in its own jitted on-device loop
(``timing.loop_job``) with the very stage functions and proposer methods the decoding program
runs (``decoding.stages``, ``decoding.proposers``), all pieces round-robin."""

from __future__ import annotations

from collections.abc import Callable, Sequence

import jax
import jax.numpy as jnp
import numpy as np

from mtpspec import decoding
from mtpspec.analysis.timing import interleaved_medians, loop_job
from mtpspec.config import ModelConfig
from mtpspec.decoding import stages
from mtpspec.decoding.commit import COMMIT_STRATEGIES
from mtpspec.decoding.proposers import Committed
from mtpspec.models.state import DecodeState


def tree_bytes(tree) -> int:
    return int(sum(np.prod(x.shape) * np.dtype(x.dtype).itemsize for x in jax.tree.leaves(tree)))


def _pin(new, old):
    """``new`` with the lengths of ``old`` where it is a DecodeState: every cache write stays
    live (it is carried), but the loop keeps writing the same rows, so N iterations need no
    extra capacity."""
    if isinstance(new, DecodeState):
        return new._replace(lengths=old.lengths, mtp_lengths=old.mtp_lengths)
    return new


def _next_tokens(logits, t, vocab):  # data dependence: the next input comes from this output
    return ((jnp.argmax(logits, -1) + t) % vocab).astype(jnp.int32)


def _prepared(config, params, prompt, k, proposer, commit, verify_method, capacity, draft):
    extra = {}
    if proposer == "draft":
        extra = dict(draft_config=draft[0], draft_params=draft[1])
    spec = decoding.SpecConfig(proposer, k, commit, verify_method, **extra)
    return decoding.prepare(
        config, params, [list(prompt)], max_new_tokens=16, speculative=spec, capacity=capacity
    )


def _target_jobs(prep, k, commits, iters, res) -> dict[str, Callable[[], None]]:
    """step, verify and commit_<strategy> jobs (plus their byte counts into ``res``)."""
    s = prep.key
    params = prep.args[0]
    carry = prep.prefill()
    state, b, vocab = carry.state, carry.pending.shape[0], s.config.vocab_size
    window = jnp.tile(carry.pending[:, None], (1, k + 1))
    active = jnp.ones((b,), bool)
    plain = s._replace(k=0, proposer=None)

    def step_body(prm, c):
        st, t = c
        o = stages.verify(plain, prm, st, t[:, 0], t[:, 1:], active)
        return _pin(o.state, st), _next_tokens(o.logits, t, vocab)

    def verify_body(prm, c):
        st, t = c
        o = stages.verify(s, prm, st, t[:, 0], t[:, 1:], active)
        return _pin(o.state, st), _next_tokens(o.logits, t, vocab)

    jobs = {
        "step": loop_job(step_body, params, (state, window[:, :1]), iters=iters),
        "verify": loop_job(verify_body, params, (state, window), iters=iters),
    }
    res["state_bytes"] = tree_bytes(state)
    n = jnp.full((b,), 1 + k // 2, jnp.int32)
    for strategy in commits:
        sk = s._replace(commit=strategy)
        verify = jax.jit(
            lambda prm, st, t, sk=sk: stages.verify(sk, prm, st, t[:, 0], t[:, 1:], active)
        )
        verified = verify(params, state, window)
        res[f"commit_data_bytes_{strategy}"] = tree_bytes(verified.commit)

        def commit_body(v, c, sk=sk):
            return _pin(stages.commit(sk, c, v, n), c)

        jobs[f"commit_{strategy}"] = loop_job(commit_body, verified, state, iters=iters)

        def verify_commit(prm, st, t, n, sk=sk):
            v = stages.verify(sk, prm, st, t[:, 0], t[:, 1:], active)
            return v.logits, stages.commit(sk, st, v, n)

        mem = jax.jit(verify_commit).lower(params, state, window, n).compile().memory_analysis()
        res[f"step_temp_bytes_{strategy}"] = None if mem is None else int(mem.temp_size_in_bytes)
    return jobs


def _draft_job(prep, k, iters) -> Callable[[], None]:
    """One proposal as the loop pays for it: ``propose`` k drafts, then ``update`` after a fully
    accepted window (the most a step folds in)."""
    s = prep.key
    params, pparams = prep.args[:2]
    carry = prep.prefill()
    b = carry.pending.shape[0]
    active = jnp.ones((b,), bool)
    full = jnp.full((b,), k + 1, jnp.int32)
    window = jnp.tile(carry.pending[:, None], (1, k + 1))
    verified = jax.jit(lambda prm, st, t: stages.verify(s, prm, st, t[:, 0], t[:, 1:], active))(
        params, carry.state, window
    )
    key = jax.random.key(0)

    def body(x, c):
        prm, pprm, hidden = x
        st, ps, pending = c
        prop = s.proposer.propose(s, prm, pprm, ps, st, pending, active, key)
        emitted = jnp.concatenate([prop.drafts, pending[:, None]], axis=1)
        done = Committed(st, hidden, emitted, full)
        ps2, st2 = s.proposer.update(s, prm, pprm, ps, prop.scratch, done, key)
        return _pin(st2, st), jax.tree.map(_pin, ps2, ps, is_leaf=_is_state), prop.drafts[:, -1]

    consts = (params, pparams, verified.hidden)
    return loop_job(body, consts, (carry.state, carry.pstate, carry.pending), iters=iters)


def _is_state(x) -> bool:
    return isinstance(x, DecodeState)


def piece_costs(
    config: ModelConfig,
    params,
    prompt: Sequence[int],
    k: int,
    *,
    proposers: Sequence[str] = ("mtp", "ngram"),
    commits: Sequence[str] = COMMIT_STRATEGIES,
    verify_method: str = "auto",
    draft: tuple[ModelConfig, dict] | None = None,
    iters: int = 64,
    repeats: int = 9,
    capacity: int | None = None,
) -> dict:
    """Seconds per call of each piece on the post-prefill state of ``prompt``: ``step`` (1-token
    target step), ``verify`` ((k+1)-token window, GDN form ``verify_method``),
    ``commit_<strategy>`` (committing 1 + k//2 of the k+1 positions), ``draft_<proposer>``
    (propose k drafts + update after a fully accepted window: for MTP the catch-up and the
    chain, for n-gram the lookup and history write, for a draft model its k + 1 one-token steps
    and its commit); and bytes: ``state_bytes`` (the target DecodeState),
    ``commit_data_bytes_<strategy>`` (what the verify window keeps for the commit; "states"
    also keeps every per-position GDN state), ``step_temp_bytes_<strategy>`` (XLA's temp buffer
    of verify + commit, ``compiled.memory_analysis()``; None where the backend can't say).
    ``capacity``: KV slots per sequence; pass generate's (``decoding.default_capacity``: every
    step attends over all of them, masked), or the pieces run on a cheaper state than the loop.
    """
    if isinstance(k, bool) or not isinstance(k, int) or k < 1:
        raise ValueError(f"k must be an int >= 1, got {k!r}")
    if not prompt:
        raise ValueError("prompt must hold at least one token")
    capacity = capacity or len(prompt) + 2 * (k + 1) + 16
    usable = [
        p
        for p in proposers
        if (p != "mtp" or (config.mtp_num_layers and "mtp" in params))
        and (p != "draft" or draft is not None)
    ]
    res: dict = {"k": k, "iters": iters}
    target = _prepared(
        config, params, prompt, k, "ngram", commits[0], verify_method, capacity, None
    )
    jobs = _target_jobs(target, k, commits, iters, res)
    for p in usable:
        prep = _prepared(config, params, prompt, k, p, commits[0], verify_method, capacity, draft)
        jobs[f"draft_{p}"] = _draft_job(prep, k, iters)
    # every piece is timed round-robin with the others (see interleaved_medians)
    res.update({name: v / iters for name, v in interleaved_medians(jobs, repeats=repeats).items()})
    return res
