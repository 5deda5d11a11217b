"""The cost of each piece of one speculative step, each timed in its own jitted on-device loop
(``timing.loop_job``) with the very stage functions and proposer methods the decoding program
runs (``decoding.stages``, ``decoding.proposers``), all pieces round-robin.

``layer_costs`` splits the target's step and verify windows further: every attention mixer, every
GDN mixer, every MLP and the LM head, each in its own loop on the post-prefill state (caches at
the decoding capacity), summed over the layers of each kind; ``model`` is the whole window,
``rest`` = model − the pieces (embedding, norms, residuals)."""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Mapping, Sequence

import jax
import jax.numpy as jnp
import numpy as np

from mtpspec import decoding
from mtpspec.analysis.timing import interleaved_medians, loop_job
from mtpspec.config import FULL, ModelConfig
from mtpspec.decoding import stages
from mtpspec.decoding.backend import window_gdn_method
from mtpspec.decoding.commit import COMMIT_STRATEGIES
from mtpspec.decoding.proposers import Committed
from mtpspec.models import layers
from mtpspec.models.decoder import lm_logits
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


def _next_tokens(out, t, vocab):  # data dependence: the next input comes from this output
    """From a verify ``StepOutput``: its argmax ids (a screened greedy head's) or its logits'."""
    ids = jnp.argmax(out.logits, -1) if out.ids is None else out.ids
    return ((ids + t) % vocab).astype(jnp.int32)


def _prepared(config, params, prompt, k, proposer, commit, verify_method, capacity, draft, linear):
    extra = {}
    if proposer == "draft":
        extra = dict(draft_config=draft[0], draft_params=draft[1])
    spec = decoding.SpecConfig(proposer, k, commit, verify_method, **extra)
    return decoding.prepare(
        config,
        params,
        [list(prompt)],
        max_new_tokens=16,
        speculative=spec,
        capacity=capacity,
        linear=linear,
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
        return _pin(o.state, st), _next_tokens(o, t, vocab)

    def verify_body(prm, c):
        st, t = c
        o = stages.verify(s, prm, st, t[:, 0], t[:, 1:], active)
        return _pin(o.state, st), _next_tokens(o, t, vocab)

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
            return _pin(stages.commit(sk, c, v, n - 1, n), c)  # a chain: row n − 1

        jobs[f"commit_{strategy}"] = loop_job(commit_body, verified, state, iters=iters)

        def verify_commit(prm, st, t, n, sk=sk):
            v = stages.verify(sk, prm, st, t[:, 0], t[:, 1:], active)
            return (v.logits, v.ids), stages.commit(sk, st, v, n - 1, n)

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
    key = carry.draws  # greedy here: the proposer draws nothing

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
    linear: str = "auto",
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
    ``capacity``: KV slots per sequence; pass generate's (``decoding.default_capacity``: with
    XLA's attention every step attends over all of them, masked; the C++ attention reads the
    live prefix only), or the pieces run on a different state than the loop.
    ``linear``: the decoding tree's linear implementation (``decoding.prepare``).
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
        config, params, prompt, k, "ngram", commits[0], verify_method, capacity, None, linear
    )
    jobs = _target_jobs(target, k, commits, iters, res)
    for p in usable:
        prep = _prepared(
            config, params, prompt, k, p, commits[0], verify_method, capacity, draft, linear
        )
        jobs[f"draft_{p}"] = _draft_job(prep, k, iters)
    # every piece is timed round-robin with the others (see interleaved_medians)
    res.update({name: v / iters for name, v in interleaved_medians(jobs, repeats=repeats).items()})
    return res


# ---- per-layer decomposition ---------------------------------------------------------------------


PIECES = ("attention", "gdn", "mlp", "lm_head")


def _layer_jobs(prepared, t: int, pieces: bool, iters: int) -> dict:
    """Loop jobs for a t-token window of the prepared call's post-prefill state: the whole target
    window ("model") and, with ``pieces``, every mixer, every MLP and the LM head."""
    s = prepared.key
    config = s.config
    params = prepared.args[0]
    carry = prepared.prefill()
    state, b = carry.state, carry.pending.shape[0]
    x = jnp.full((b, t, config.hidden_size), 0.1, jnp.float32)
    start, valid = state.lengths, jnp.full((b,), t, jnp.int32)
    method = window_gdn_method(config, "auto", t, sharded=s.mesh is not None)  # as prepare
    jobs = {}
    attn = [i for i, lt in enumerate(config.layer_types) if lt == FULL]
    gdn = [i for i, lt in enumerate(config.layer_types) if lt != FULL]
    # each piece runs over all its layers back to back, as in the model (a lone call would pay
    # start-up costs, e.g. waking a helper thread, that the model's call sequence hides)
    for kind, idx in (("attention", attn), ("gdn", gdn)) if pieces else ():

        def mixers(prm, c, idx=idx, kind=kind):
            h, caches = c
            for i, cache in zip(idx, caches):
                p = prm[i]
                if kind == "attention":
                    out, _ = layers.attention(config, p["attn"], h, start, valid, cache)
                else:
                    out, _, _ = layers.gdn(config, p["gdn"], h, valid, cache, method)
                h = h + 1e-3 * out.astype(h.dtype)
            return h, caches

        if idx:
            caches = tuple(state.layers[i] for i in idx)
            jobs[(kind, 0)] = loop_job(mixers, params["layers"], (x, caches), iters=iters)

    def mlps(prm, h):
        for i, p in enumerate(prm):
            h = h + 1e-3 * layers.mlp(config, config.mlp_types[i], p["mlp"], h)
        return h

    def head(prm, h):
        return h + 1e-3 * jnp.mean(lm_logits(config, prm, h), axis=-1, keepdims=True)

    if pieces:
        jobs[("mlp", 0)] = loop_job(mlps, params["layers"], x, iters=iters)
        jobs[("lm_head", 0)] = loop_job(head, params, x, iters=iters)
    sk = s._replace(k=t - 1, proposer=None, backend=dataclasses.replace(s.backend, verify=method))
    active = jnp.ones((b,), bool)

    def window(prm, c):
        st, tk = c
        o = stages.verify(sk, prm, st, tk[:, 0], tk[:, 1:], active)
        return _pin(o.state, st), _next_tokens(o, tk, config.vocab_size)

    tokens = jnp.tile(carry.pending[:, None], (1, t))
    jobs[("model", 0)] = loop_job(window, params, (state, tokens), iters=iters)
    return jobs


def layer_costs(
    prepared: Mapping,
    ts: Sequence[int] = (1, 3, 4),
    *,
    pieces: bool = True,
    iters: int = 48,
    repeats: int = 9,
) -> dict:
    """Seconds per call, ``{name: {t: {piece: s}}}``, for each prepared call in ``prepared``
    (``name -> decoding.prepare(...)``, e.g. one per linear implementation), all timed
    round-robin together: the whole t-token target window (``model``) and, with ``pieces``, each
    of ``PIECES`` summed over the layers and ``rest`` = model − pieces. Window t = 1 is the
    decode step."""
    jobs = {}
    for name, prep in prepared.items():
        for t in ts:
            for (piece, i), job in _layer_jobs(prep, t, pieces, iters).items():
                jobs[(name, t, piece, i)] = job
    medians = interleaved_medians(jobs, repeats=repeats)
    out: dict = {}
    for (name, t, piece, _), sec in medians.items():
        row = out.setdefault(name, {}).setdefault(t, {})
        row[piece] = row.get(piece, 0.0) + sec / iters
    if pieces:
        for rows in out.values():
            for row in rows.values():
                row["rest"] = row["model"] - sum(row.get(p, 0.0) for p in PIECES)
    return out
