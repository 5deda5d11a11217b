"""``mtpspec.generate``: prefill + plain or speculative decoding as one jitted ``lax.while_loop``.

The decode state always holds every emitted token except the last (the *pending* token). One
iteration verifies the window [pending, d_1..d_k] in one forward (k + 1 logits), accepts the longest
prefix of drafts equal to the target's choice (a of them), emits d_1..d_a plus the target's token at
position a (correction, or bonus when a = k), commits the state to the first a + 1 window
positions, and drafts again. Plain decoding is the same loop with k = 0 (window = [pending]).

Static (one compile each): the model config, k, proposer, commit strategy, verify GDN method,
sampling settings, batch size, padded prompt length, output buffer size and capacity. Everything
per sequence (prompt lengths, max_new_tokens, accepted counts, stops) travels as arrays and masks.
Prompt lengths are padded to multiples of 16 and max_new_tokens to multiples of 16 (buckets), so
nearby requests reuse a compile.
"""

from __future__ import annotations

import dataclasses
import functools
import logging
import time
from collections.abc import Iterator, Sequence
from typing import Any, NamedTuple

import jax
import jax.numpy as jnp
import numpy as np
from jax.sharding import NamedSharding
from jax.sharding import PartitionSpec as P

from mtpspec import sharding
from mtpspec.config import ModelConfig
from mtpspec.decoding import sampling
from mtpspec.decoding.commit import COMMIT_STRATEGIES, commit_window
from mtpspec.decoding.proposers import draft_model_propose, mtp_catch_up_and_draft, ngram_propose
from mtpspec.decoding.sampling import check_sampling_args, draft_probs, select_tokens
from mtpspec.models.decoder import window_step_impl
from mtpspec.models.state import init_decode_state
from mtpspec.ops.gdn.api import AUTO_RECURRENT_MAX_T
from mtpspec.sharding import DATA

logger = logging.getLogger(__name__)
PROPOSERS = ("mtp", "ngram", "draft")
VERIFY_METHODS = ("auto", "recurrent", "chunk", "assoc", "pallas")
BUCKET = 16
RUNNING, STOP_EOS, STOP_LENGTH, STOP_CAPACITY = 0, 1, 2, 3
STOP_NAMES = {STOP_EOS: "eos", STOP_LENGTH: "length", STOP_CAPACITY: "capacity"}


@dataclasses.dataclass(frozen=True, eq=False)
class SpecConfig:
    """Speculative decoding settings.

    proposer: "mtp" (the model's MTP head, chained for k > 1), "ngram" (prompt lookup over each
    sequence's history, n in ngram_min..ngram_max), "draft" (a separate mtpspec model sharing the
    vocabulary: ``draft_config``, ``draft_params``; its state is committed like the target's).
    num_draft: k drafts per verify step. commit: "scan" | "states" | "replay" (equal results).
    verify_method: GDN form inside the verify window ("auto" = ops.resolve_gdn_method).
    """

    proposer: str = "mtp"
    num_draft: int = 2
    commit: str = "scan"
    verify_method: str = "auto"
    ngram_min: int = 1
    ngram_max: int = 3
    draft_config: ModelConfig | None = None
    draft_params: Any = None

    def validate(self, config: ModelConfig, params) -> None:
        k = self.num_draft
        if isinstance(k, bool) or not isinstance(k, int) or k < 1:
            raise ValueError(f"num_draft must be an int >= 1, got {k!r}")
        if self.proposer not in PROPOSERS:
            raise ValueError(f"unknown proposer {self.proposer!r}; expected one of {PROPOSERS}")
        if self.commit not in COMMIT_STRATEGIES:
            raise ValueError(
                f"unknown commit strategy {self.commit!r}; expected one of {COMMIT_STRATEGIES}"
            )
        if self.verify_method not in VERIFY_METHODS:
            raise ValueError(
                f"unknown verify_method {self.verify_method!r}; expected one of {VERIFY_METHODS}"
            )
        if self.proposer == "mtp" and (not config.mtp_num_layers or "mtp" not in params):
            raise ValueError("proposer='mtp' needs a model with an MTP head (mtp.* weights)")
        if self.proposer == "ngram" and not (
            isinstance(self.ngram_min, int)
            and isinstance(self.ngram_max, int)
            and 1 <= self.ngram_min <= self.ngram_max
        ):
            raise ValueError(
                f"need 1 <= ngram_min <= ngram_max, got {self.ngram_min}, {self.ngram_max}"
            )
        if self.proposer == "draft":
            if not isinstance(self.draft_config, ModelConfig) or self.draft_params is None:
                raise ValueError(
                    "proposer='draft' needs draft_config (a ModelConfig) and draft_params"
                )
            if self.draft_config.vocab_size != config.vocab_size:
                raise ValueError(
                    f"draft model vocabulary ({self.draft_config.vocab_size}) differs from the "
                    f"target's ({config.vocab_size})"
                )
            if not isinstance(self.draft_params, dict) or "embed" not in self.draft_params:
                raise TypeError("draft_params must be a parameter tree (dict) of the draft model")
            shape = tuple(self.draft_params["embed"].shape)
            want = (self.draft_config.vocab_size, self.draft_config.hidden_size)
            if shape != want:
                raise ValueError(
                    f"draft_params['embed'] has shape {shape}, draft_config says {want}"
                )


class _Static(NamedTuple):
    """Everything that selects a compiled program (hashable)."""

    config: ModelConfig
    k: int
    proposer: str  # "none" for plain decoding
    commit: str
    verify_method: str
    ngram: tuple[int, int]
    temperature: float
    top_k: int
    top_p: float
    capacity: int
    out_size: int
    draft_config: ModelConfig | None = None
    mesh: Any = None  # an Auto-typed (data, model) Mesh, or None for one device
    prefill_method: str = "auto"  # GDN form of the prefill ("chunk" under a mesh)


class GenerateResult(NamedTuple):
    tokens: list[list[int]]  # emitted ids per prompt (eos included when hit)
    stop_reasons: list[str]  # "eos" | "length" | "capacity" per prompt
    stats: dict  # acceptance and timing figures (see ``generate``)


# ---- the jitted program -------------------------------------------------------------------------


class _Carry(NamedTuple):
    state: Any
    pending: jax.Array  # [b]
    drafts: jax.Array  # [b, k]
    q: jax.Array  # [b, k, V] draft probabilities when sampling, [b, k, 0] when greedy
    dstate: Any  # the draft model's DecodeState (proposer "draft"), else None
    hist: jax.Array  # [b, capacity + 1] prompt + emitted tokens (n-gram only; else [b, 0])
    out: jax.Array  # [b, out_size]
    count: jax.Array  # [b] emitted so far
    stop: jax.Array  # [b] RUNNING or a stop code
    accepts: jax.Array  # [out_size, b] accepted drafts per step (−1: not active)
    step: jax.Array  # []
    key: jax.Array


def _selector(s: _Static, key):
    def select(logits, salt):
        return select_tokens(logits, jax.random.fold_in(key, salt), s.temperature, s.top_k, s.top_p)

    return select


def _draft_selector(s: _Static, key):
    """(logits, salt) -> (ids, q): drafts are drawn from q at the same sampling settings."""

    def select(logits, salt):
        ids = select_tokens(logits, jax.random.fold_in(key, salt), s.temperature, s.top_k, s.top_p)
        return ids, draft_probs(logits, s.temperature, s.top_k, s.top_p)

    return select


def _ngram_q(s: _Static, drafts):
    """n-gram drafts are deterministic: q is one-hot on the draft."""
    if s.temperature == 0.0:
        return jnp.zeros(drafts.shape + (0,), jnp.float32)
    return jax.nn.one_hot(drafts, s.config.vocab_size, dtype=jnp.float32)


def _constrain(s: _Static, c: _Carry) -> _Carry:
    """Under a mesh, pin the carry's layout: decode states by the sharding rules (heads on
    ``model``, batch on ``data``), every other per-sequence array batch-on-``data``."""
    if s.mesh is None:
        return c
    mesh = s.mesh

    def rows(x):
        return jax.lax.with_sharding_constraint(x, sharding.batch_sharding(mesh, x.ndim))

    state = sharding.constrain_state(s.config, c.state, mesh)
    dstate = c.dstate
    if dstate is not None:
        dstate = sharding.constrain_state(s.draft_config, dstate, mesh)
    batch_fields = {f: rows(getattr(c, f)) for f in ("pending", "drafts", "q", "hist", "out")}
    batch_fields.update(count=rows(c.count), stop=rows(c.stop))
    batch_fields["accepts"] = jax.lax.with_sharding_constraint(
        c.accepts, NamedSharding(mesh, P(None, DATA))
    )
    return c._replace(state=state, dstate=dstate, **batch_fields)


def _check_capacity(s: _Static, lengths, stop):
    """Stop sequences whose next verify window would not fit (never wrap around)."""
    full = lengths + s.k + 1 > s.capacity
    return jnp.where((stop == RUNNING) & full, STOP_CAPACITY, stop)


def _prefill(s: _Static, params, dparams, prompts, lengths, max_new, eos, key) -> _Carry:
    b, p = prompts.shape
    state = init_decode_state(s.config, b, s.capacity)
    out = window_step_impl(s.config, params, state, prompts, lengths, s.prefill_method)
    rows = (lengths - 1)[:, None, None]
    last_logits = jnp.take_along_axis(out.logits, rows, axis=1)[:, 0]
    first = _selector(s, jax.random.fold_in(key, 2**30))(last_logits, 0)
    state = out.state
    drafts = jnp.zeros((b, s.k), jnp.int32)
    q = jnp.zeros((b, s.k, s.config.vocab_size if s.temperature > 0 else 0), jnp.float32)
    dstate = None
    hist = jnp.zeros((b, s.capacity + 1 if s.proposer == "ngram" else 0), jnp.int32)
    if s.proposer == "ngram":  # only the n-gram proposer reads the history
        hist = hist.at[:, :p].set(prompts).at[jnp.arange(b), lengths].set(first)
    if s.proposer == "mtp":
        nxt = jnp.concatenate([prompts[:, 1:], prompts[:, :1]], axis=1)
        nxt = jnp.where(jnp.arange(p)[None] == (lengths - 1)[:, None], first[:, None], nxt)
        select = _draft_selector(s, jax.random.fold_in(key, 2**30 + 1))
        drafts, q, state = mtp_catch_up_and_draft(
            s.config, params, state, out.hidden, nxt, lengths, s.k, select
        )
    elif s.proposer == "ngram":
        drafts = ngram_propose(hist, lengths + 1, s.k, *s.ngram)
        q = _ngram_q(s, drafts)
    elif s.proposer == "draft":
        dstate = init_decode_state(s.draft_config, b, s.capacity)
        dstate = window_step_impl(
            s.draft_config, dparams, dstate, prompts, lengths, s.prefill_method
        ).state
    out_buf = jnp.zeros((b, s.out_size), jnp.int32).at[:, 0].set(first)
    count = jnp.ones((b,), jnp.int32)
    stop = jnp.where(first == eos, STOP_EOS, jnp.where(count >= max_new, STOP_LENGTH, RUNNING))
    stop = _check_capacity(s, state.lengths, stop)
    accepts = jnp.full((s.out_size, b), -1, jnp.int32)
    carry = _Carry(
        state, first, drafts, q, dstate, hist, out_buf, count, stop, accepts, jnp.int32(0), key
    )
    return _constrain(s, carry)


def _step(s: _Static, params, dparams, max_new, eos, c: _Carry) -> _Carry:
    k = s.k
    b = c.pending.shape[0]
    active = c.stop == RUNNING
    step_key = jax.random.fold_in(c.key, c.step)
    drafts, q = c.drafts, c.q
    if s.proposer == "draft":
        select = _draft_selector(s, jax.random.fold_in(step_key, 1))
        drafts, q, dafter, dcommits = draft_model_propose(
            s.draft_config, dparams, c.dstate, c.pending, active, k, select, s.commit == "states"
        )
    window = jnp.concatenate([c.pending[:, None], drafts], axis=1)  # [b, k + 1]
    valid = jnp.where(active, k + 1, 0).astype(jnp.int32)
    verified = window_step_impl(
        s.config, params, c.state, window, valid, s.verify_method, s.commit == "states"
    )
    if k and s.temperature > 0:  # lossless rejection sampling
        accepted, token = sampling.speculative_accept(
            jax.random.fold_in(step_key, 0),
            verified.logits,
            drafts,
            q,
            s.temperature,
            s.top_k,
            s.top_p,
        )
        new_token = token[:, None]
    else:  # greedy acceptance (or plain decoding, k = 0)
        target = _selector(s, step_key)(verified.logits, 0)  # [b, k + 1]
        same = (drafts == target[:, :k]).astype(jnp.int32)
        accepted = jnp.sum(jnp.cumprod(same, axis=1), axis=1).astype(jnp.int32)  # a
        new_token = jnp.take_along_axis(target, accepted[:, None], axis=1)  # [b, 1]
    n = jnp.where(active, accepted + 1, 0)
    if k:
        state = commit_window(c.state, verified.state, verified.commit, n, s.commit)
    else:
        state = verified.state  # the window is exactly the accepted prefix
    # emitted e_j: accepted drafts, then the target's token at position a
    j = jnp.arange(k + 1)[None, :]
    emitted = jnp.where(
        j < accepted[:, None], jnp.concatenate([drafts, new_token], axis=1), new_token
    )
    m = n  # tokens emitted this step
    is_eos = (emitted == eos) & (j < m[:, None])
    first_eos = jnp.min(jnp.where(is_eos, j, k + 1), axis=1)
    hit_eos = first_eos <= k
    m = jnp.where(hit_eos, first_eos + 1, m)
    room = max_new - c.count
    hit_len = m >= room
    m = jnp.minimum(m, room)
    idx = jnp.where(j < m[:, None], c.count[:, None] + j, s.out_size)  # out of range = dropped
    rows = jnp.arange(b)[:, None]
    out = c.out.at[rows, idx].set(emitted, mode="drop")
    hist = c.hist
    if s.proposer == "ngram":
        hidx = jnp.where(j < n[:, None], c.state.lengths[:, None] + 1 + j, s.capacity + 1)
        hist = hist.at[rows, hidx].set(emitted, mode="drop")
    count = c.count + m
    stop = jnp.where(active & hit_eos, STOP_EOS, jnp.where(active & hit_len, STOP_LENGTH, c.stop))
    stop = _check_capacity(s, state.lengths, stop)
    pending = jnp.where(active, new_token[:, 0], c.pending)
    dstate = c.dstate
    if s.proposer == "draft":
        dstate = commit_window(c.dstate, dafter, dcommits, n, s.commit)
    elif s.proposer == "mtp":
        select = _draft_selector(s, jax.random.fold_in(step_key, 2))
        drafts, q, state = mtp_catch_up_and_draft(
            s.config, params, state, verified.hidden, emitted, n, k, select
        )
    elif s.proposer == "ngram":
        drafts = ngram_propose(hist, state.lengths + 1, k, *s.ngram)
        q = _ngram_q(s, drafts)
    accepts = c.accepts.at[c.step].set(jnp.where(active, accepted, -1))
    carry = _Carry(
        state, pending, drafts, q, dstate, hist, out, count, stop, accepts, c.step + 1, c.key
    )
    return _constrain(s, carry)


def _generate_program(s: _Static, params, dparams, prompts, lengths, max_new, eos, key):
    carry = _prefill(s, params, dparams, prompts, lengths, max_new, eos, key)

    def cond(c):
        return (c.step < s.out_size) & jnp.any(c.stop == RUNNING)

    def body(c):
        return _step(s, params, dparams, max_new, eos, c)

    carry = jax.lax.while_loop(cond, body, carry)
    return carry.out, carry.count, carry.stop, carry.accepts, carry.step


_program = jax.jit(_generate_program, static_argnums=0)
_prefill_jit = jax.jit(_prefill, static_argnums=0)
_step_jit = jax.jit(_step, static_argnums=0)
_COMPILED: dict = {}  # (static, shapes) -> compiled executable; one entry per compile


def compile_count() -> int:
    """How many generate programs have been compiled in this process (tests use it)."""
    return len(_COMPILED)


# ---- validation and the public API --------------------------------------------------------------


@functools.lru_cache(maxsize=8)
def _log_mesh_methods(verify_method: str) -> None:
    logger.info(
        "generate under a mesh: GDN prefill 'chunk', verify %r (auto never picks pallas there)",
        verify_method,
    )


def _round_up(x: int, m: int) -> int:
    return -(-x // m) * m


def _check_prompts(config: ModelConfig, prompts) -> list[list[int]]:
    if isinstance(prompts, np.ndarray | jax.Array):
        raise TypeError("prompts must be a list of token-id lists (ragged batch), not an array")
    if not isinstance(prompts, Sequence) or isinstance(prompts, str) or not prompts:
        raise ValueError("prompts must be a non-empty list of token-id lists")
    out = []
    for i, p in enumerate(prompts):
        if not isinstance(p, Sequence) or isinstance(p, str):
            raise TypeError(f"prompt {i} must be a list of ints, got {type(p).__name__}")
        if len(p) == 0:
            raise ValueError(f"prompt {i} is empty")
        for t in p:
            if isinstance(t, bool) or not isinstance(t, int | np.integer):
                raise TypeError(f"prompt {i} holds a non-integer token {t!r}")
            if not 0 <= int(t) < config.vocab_size:
                raise ValueError(
                    f"prompt {i} holds token {int(t)} outside the vocabulary "
                    f"[0, {config.vocab_size})"
                )
        out.append([int(t) for t in p])
    return out


def _prepare(
    config,
    params,
    prompts,
    max_new_tokens,
    speculative,
    temperature,
    top_k,
    top_p,
    eos_id,
    mesh,
    capacity,
):
    if not isinstance(config, ModelConfig):
        raise TypeError(f"config must be a ModelConfig, got {type(config).__name__}")
    prompts = _check_prompts(config, prompts)
    if isinstance(max_new_tokens, bool) or not isinstance(max_new_tokens, int):
        raise TypeError(f"max_new_tokens must be an int, got {type(max_new_tokens).__name__}")
    if max_new_tokens < 0:
        raise ValueError(f"max_new_tokens must be >= 0, got {max_new_tokens}")
    check_sampling_args(temperature, top_k, top_p)
    if speculative is not None and not isinstance(speculative, SpecConfig):
        raise TypeError(
            f"speculative must be None or a SpecConfig, got {type(speculative).__name__}"
        )
    if speculative is not None:
        speculative.validate(config, params)
    if eos_id is not None and (
        isinstance(eos_id, bool)
        or not isinstance(eos_id, int)
        or not 0 <= eos_id < config.vocab_size
    ):
        raise ValueError(
            f"eos_id must be None or a token id in [0, {config.vocab_size}), got {eos_id!r}"
        )
    k = speculative.num_draft if speculative else 0
    verify_method = speculative.verify_method if speculative else "auto"
    prefill_method = "auto"
    if mesh is not None:
        mesh = sharding.check_mesh(mesh)
        sharding.check_param_tree(config, params)
        if speculative is not None and speculative.proposer == "draft":
            sharding.check_param_tree(speculative.draft_config, speculative.draft_params)
        # pallas_call has no GSPMD partitioning rule (a shard_map wrapper is not written yet):
        # under a mesh an explicit "pallas" is refused and "auto" never picks it.
        if verify_method == "pallas":
            raise ValueError(
                "verify_method='pallas' cannot run under a mesh (the Pallas kernel is not "
                "partitioned); use 'auto' or 'chunk'"
            )
        if verify_method == "auto":
            verify_method = "recurrent" if k + 1 <= AUTO_RECURRENT_MAX_T else "chunk"
        prefill_method = "chunk"
        _log_mesh_methods(verify_method)
    longest = max(len(p) for p in prompts)
    p_pad = _round_up(longest, BUCKET)
    out_size = _round_up(max(max_new_tokens, 1), BUCKET)
    if capacity is None:
        capacity = p_pad + out_size + k + 1
    elif isinstance(capacity, bool) or not isinstance(capacity, int):
        raise TypeError(f"capacity must be an int, got {type(capacity).__name__}")
    if capacity < p_pad or capacity < longest + 1:
        raise ValueError(
            f"capacity {capacity} cannot hold the longest prompt ({longest} tokens, padded to "
            f"{p_pad}) plus one generated token"
        )
    static = _Static(
        config=config,
        k=k,
        proposer=speculative.proposer if speculative else "none",
        commit=speculative.commit if speculative else "scan",
        verify_method=verify_method,
        ngram=(speculative.ngram_min, speculative.ngram_max) if speculative else (1, 1),
        temperature=float(temperature),
        top_k=int(top_k),
        top_p=float(top_p),
        capacity=int(capacity),
        out_size=out_size,
        draft_config=speculative.draft_config if k and speculative.proposer == "draft" else None,
        mesh=mesh,
        prefill_method=prefill_method,
    )
    b = len(prompts)
    if mesh is not None:  # pad the batch to a multiple of the data axis with 1-token dummies
        b = _round_up(b, mesh.shape[DATA])
    tokens = np.zeros((b, p_pad), np.int32)
    for i, p in enumerate(prompts):
        tokens[i, : len(p)] = p
    lengths = np.ones((b,), np.int32)
    lengths[: len(prompts)] = [len(p) for p in prompts]
    max_new = np.ones((b,), np.int32)  # a dummy row stops right after its prefill token
    max_new[: len(prompts)] = max_new_tokens
    eos = np.int32(-1 if eos_id is None else eos_id)
    return static, (tokens, lengths, max_new, eos)


def generate(
    config: ModelConfig,
    params,
    prompts: list[list[int]],
    *,
    max_new_tokens: int,
    speculative: SpecConfig | None = None,
    temperature: float = 0.0,
    top_k: int = 0,
    top_p: float = 1.0,
    seed: int = 0,
    eos_id: int | None = None,
    mesh=None,
    capacity: int | None = None,
) -> GenerateResult:
    """Plain or speculative decoding of a ragged batch, prefill + loop in one jitted program.

    ``result.stats``: ``steps`` (verify steps per sequence), ``accepted`` (per step, per sequence:
    drafts accepted, −1 when inactive), ``tau`` (emitted tokens per verify step, prefill token
    excluded), ``position_acceptance`` (fraction of steps accepting ≥ i drafts, i = 1..k),
    ``compile_s``, ``run_s`` (prefill + loop, compile excluded), ``tokens_per_s``.
    Bad arguments raise ValueError / TypeError before any device work; capacity overflow stops a
    sequence with stop reason "capacity" (never wraps around).
    """
    static, arrays = _prepare(
        config,
        params,
        prompts,
        max_new_tokens,
        speculative,
        temperature,
        top_k,
        top_p,
        eos_id,
        mesh,
        capacity,
    )
    b = len(prompts)
    if max_new_tokens == 0:
        return GenerateResult([[] for _ in range(b)], ["length"] * b, {"steps": [0] * b})
    dparams = speculative.draft_params if static.draft_config is not None else None
    args = _device_args(static, params, dparams, arrays, seed)
    sig = (
        static,
        jax.tree.structure(params),
        tuple((x.shape, str(x.dtype)) for x in jax.tree.leaves(args)),
    )
    compile_s = 0.0
    if sig not in _COMPILED:
        t0 = time.perf_counter()
        _COMPILED[sig] = _program.lower(static, *args).compile()
        compile_s = time.perf_counter() - t0
    t0 = time.perf_counter()
    out, count, stop, accepts, steps = jax.block_until_ready(_COMPILED[sig](*args))
    run_s = time.perf_counter() - t0
    return _result(static, out, count, stop, accepts, steps, compile_s, run_s, b)


def _device_args(static: _Static, params, dparams, arrays, seed: int) -> tuple:
    """(params, dparams, tokens, lengths, max_new, eos, key) on the device(s): under a mesh the
    weights are placed by the sharding rules (already-placed leaves are kept) and the
    per-sequence arrays split on ``data``."""
    if static.mesh is None:
        return (params, dparams, *(jnp.asarray(a) for a in arrays), jax.random.key(int(seed)))
    mesh = static.mesh
    params = sharding.shard_params(static.config, params, mesh)
    if dparams is not None:
        dparams = sharding.shard_params(static.draft_config, dparams, mesh)
    tokens, lengths, max_new, eos = arrays

    def rows(x):
        return sharding.place_host_array(x, sharding.batch_sharding(mesh, x.ndim))

    return (
        params,
        dparams,
        rows(tokens),
        rows(lengths),
        rows(max_new),
        put_replicated(eos, mesh),
        _replicated_key(seed, mesh),
    )


def _replicated_key(seed: int, mesh) -> jax.Array:
    """``jax.random.key(seed)`` on every device of ``mesh`` (each process places its own)."""
    data = np.asarray(jax.random.key_data(jax.random.key(int(seed))))
    return jax.random.wrap_key_data(put_replicated(data, mesh))


def put_replicated(value, mesh) -> jax.Array:
    return sharding.place_host_array(np.asarray(value), NamedSharding(mesh, P()))


def _result(static, out, count, stop, accepts, steps, compile_s, run_s, n) -> GenerateResult:
    """Host-side results for the first ``n`` rows (the rest are data-axis padding)."""
    host = sharding.to_host
    out, count, stop = host(out)[:n], host(count)[:n], host(stop)[:n]
    accepts = host(accepts)[: int(host(steps)), :n]
    tokens = [out[i, : count[i]].tolist() for i in range(len(count))]
    active = accepts >= 0
    steps_per_seq = active.sum(axis=0)
    emitted_by_steps = np.where(active, accepts + 1, 0).sum(axis=0)
    k = static.k
    stats = {
        "steps": steps_per_seq.tolist(),
        "accepted": accepts.T.tolist(),
        "tau": float(emitted_by_steps.sum() / max(steps_per_seq.sum(), 1)),
        "tau_per_sequence": (emitted_by_steps / np.maximum(steps_per_seq, 1)).tolist(),
        "position_acceptance": [
            float(((accepts >= i) & active).sum() / max(active.sum(), 1)) for i in range(1, k + 1)
        ],
        "num_draft": k,
        "compile_s": compile_s,
        "run_s": run_s,
        "tokens_per_s": float(count.sum() / run_s) if run_s > 0 else float("nan"),
    }
    return GenerateResult(tokens, [STOP_NAMES[int(c)] for c in stop], stats)


def generate_stream(
    config: ModelConfig,
    params,
    prompts: list[list[int]],
    *,
    max_new_tokens: int,
    speculative: SpecConfig | None = None,
    temperature: float = 0.0,
    top_k: int = 0,
    top_p: float = 1.0,
    seed: int = 0,
    eos_id: int | None = None,
    mesh=None,
    capacity: int | None = None,
) -> Iterator[list[list[int]]]:
    """Same decoding, one verify step per iteration from Python (for notebooks): yields, per step,
    the tokens each sequence emitted in that step (the first yield is the prefill token). The
    jitted prefill and step are the very functions the on-device loop runs."""
    static, arrays = _prepare(
        config,
        params,
        prompts,
        max_new_tokens,
        speculative,
        temperature,
        top_k,
        top_p,
        eos_id,
        mesh,
        capacity,
    )
    if max_new_tokens == 0:
        return
    dparams = speculative.draft_params if static.draft_config is not None else None
    args = _device_args(static, params, dparams, arrays, seed)
    params, dparams, _, _, max_new, eos, _ = args
    carry = _prefill_jit(static, *args)
    n = len(prompts)
    seen = np.zeros(n, np.int64)
    while True:
        count = sharding.to_host(carry.count)[:n]
        out = sharding.to_host(carry.out)[:n]
        yield [out[i, seen[i] : count[i]].tolist() for i in range(n)]
        seen = count
        stop = sharding.to_host(carry.stop)
        if not (stop == RUNNING).any() or int(sharding.to_host(carry.step)) >= static.out_size:
            return
        carry = _step_jit(static, params, dparams, max_new, eos, carry)
