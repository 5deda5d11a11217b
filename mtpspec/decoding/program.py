"""The jitted decoding program: prefill, then a ``lax.while_loop`` of verify steps built from the
named stages (``stages``) and the proposer protocol (``proposers``).

The decode state always holds every emitted token except the last (the *pending* token). Plain
decoding is the same loop with k = 0 (window = [pending], no proposer).

Static (the ``ProgramKey``; one compile each): model config, k, proposer (with its static
options), commit strategy, the ``Backend`` (GDN forms of verify and prefill, linear and attention
implementations, the C++ kernels' settings), whether every row is greedy, whether
log-probabilities are kept, capacity, output buffer size and the mesh. Everything per
sequence (prompt lengths, max_new_tokens, EOS ids, sampling settings and keys, accepted counts,
stops) travels as arrays and masks.

Compiled programs are kept in a bounded LRU cache (``ProgramCache``) keyed on (ProgramKey, the
param tree's structure, the shape and dtype of every argument).
"""

from __future__ import annotations

import collections
import logging
import threading
from typing import Any, NamedTuple

import jax
import jax.numpy as jnp
from jax.sharding import NamedSharding
from jax.sharding import PartitionSpec as P

from mtpspec import compiled, sharding
from mtpspec.config import ModelConfig
from mtpspec.decoding import adaptive, stages
from mtpspec.decoding.adaptive import DraftLimits, Policy
from mtpspec.decoding.backend import Backend
from mtpspec.decoding.proposers import Committed, Prefilled, Proposer
from mtpspec.decoding.proposers.base import Budget
from mtpspec.decoding.sampling import Draws, Sampling
from mtpspec.decoding.stages import RUNNING, STOP_EOS, STOP_LENGTH
from mtpspec.kernels import settings
from mtpspec.models.decoder import window_step_impl
from mtpspec.models.state import init_decode_state

# Salts of the per-purpose keys (each row folds its own key, ``Draws.fold``): FIRST_TOKEN for the
# prefill token, PROPOSER_INIT for the proposer's init; inside step i, fold(i) then ACCEPT /
# PROPOSE / UPDATE.
FIRST_TOKEN, PROPOSER_INIT = 2**30, 2**30 + 1
ACCEPT, PROPOSE, UPDATE = 0, 1, 2


class ProgramKey(NamedTuple):
    """Everything that selects a compiled program (hashable)."""

    config: ModelConfig
    k: int  # drafts per verify step (0: plain decoding)
    proposer: Proposer | None  # None for plain decoding
    commit: str
    sampling: Sampling  # static mode only (greedy or not); the settings are per-row arrays
    capacity: int  # KV slots per sequence
    out_size: int  # output buffer per sequence (max_new_tokens bucket)
    backend: Backend  # linear, attention, GDN forms, the kernels' settings (``backend.resolve``)
    mesh: Any = None  # an Auto-typed (data, model) Mesh, or None for one device
    logprobs: bool = False  # keep each emitted token's log-probability (``Carry.logp``)
    tree: Any = None  # a ``models.tree.TreeShape`` (tree speculation; depth k) or None (a chain)
    adaptive: bool = False  # the draft length adapts per step (``decoding.adaptive``; chains)


class Carry(NamedTuple):
    state: Any  # the target's DecodeState (every emitted token but the pending one)
    pending: jax.Array  # [b]
    pstate: Any  # the proposer's state (None for plain decoding)
    out: jax.Array  # [b, out_size]
    count: jax.Array  # [b] emitted so far
    stop: jax.Array  # [b] RUNNING or a stop code
    accepts: jax.Array  # [out_size, b] accepted drafts per step (−1: not active)
    step: jax.Array  # []
    draws: Draws  # per-row keys and sampling settings
    logp: jax.Array  # [b, out_size] f32 log-probability of each emitted token ([b, 0] when off)
    node: jax.Array  # [b] the last step's accepted window row (−1: not active, or no step yet)
    limits: DraftLimits  # the call's p_min and adaptive flag (arrays: never recompiled)
    policy: Policy  # [b] per-sequence draft length and its running average
    drafted: jax.Array  # [out_size, b] drafts in each step's window (−1: not active)


def _constrain(s: ProgramKey, c: Carry) -> Carry:
    """Under a mesh, pin the carry's layout: the decode state by the sharding rules (heads on
    ``model``, batch on ``data``), the proposer's state by its own rule, the rest batch-on-data."""
    if s.mesh is None:
        return c

    def rows(x):
        return jax.lax.with_sharding_constraint(x, sharding.batch_sharding(s.mesh, x.ndim))

    pstate = c.pstate if s.proposer is None else s.proposer.constrain(s, c.pstate, s.mesh)
    return c._replace(
        state=sharding.constrain_state(s.config, c.state, s.mesh),
        pstate=pstate,
        pending=rows(c.pending),
        out=rows(c.out),
        count=rows(c.count),
        stop=rows(c.stop),
        accepts=jax.lax.with_sharding_constraint(c.accepts, NamedSharding(s.mesh, P(None, "data"))),
        draws=jax.tree.map(rows, c.draws),
        logp=rows(c.logp),
        node=rows(c.node),
        limits=jax.tree.map(
            lambda x: jax.lax.with_sharding_constraint(x, NamedSharding(s.mesh, P())), c.limits
        ),
        policy=jax.tree.map(rows, c.policy),
        drafted=jax.lax.with_sharding_constraint(c.drafted, NamedSharding(s.mesh, P(None, "data"))),
    )


def _token_logp(logits, tokens):
    """log softmax(logits)[token]: the model's own distribution (temperature 1, unfiltered)."""
    logp = jax.nn.log_softmax(logits.astype(jnp.float32), axis=-1)
    return jnp.take_along_axis(logp, tokens[..., None], axis=-1)[..., 0]


def prefill(
    s: ProgramKey, params, pparams, prompts, lengths, max_new, eos, draws, limits: DraftLimits
) -> Carry:
    """Prompt forward, the first token, the proposer's init. Traced in
    ``kernels.settings.prefill_scope``: with ``KernelSettings.prefill_activations="bfloat16"`` the
    prompt's bf16-weight linears (the proposer's init included) take bf16 activations; the decode
    steps and verify windows never do."""
    b = prompts.shape[0]
    state = init_decode_state(s.config, b, s.capacity)
    with settings.prefill_scope():
        ids_only = stages.argmax_only(s, params)
        out = window_step_impl(
            s.config,
            params,
            state,
            prompts,
            lengths,
            s.backend.prefill,
            logits_at=lengths - 1,
            argmax_only=ids_only,
        )
        if ids_only:
            last_logits, first = None, out.ids[:, 0]
        else:
            last_logits = out.logits[:, 0]
            first = s.sampling.select(last_logits, draws.fold(FIRST_TOKEN).fold(0))
        state, pstate = out.state, None
        if s.proposer is not None:
            pre = Prefilled(prompts, lengths, first, out.hidden, state)
            pstate, state = s.proposer.init(s, params, pparams, pre, draws.fold(PROPOSER_INIT))
    count = jnp.ones((b,), jnp.int32)
    hit_eos = stages.is_eos(first, eos)
    stop = jnp.where(hit_eos, STOP_EOS, jnp.where(count >= max_new, STOP_LENGTH, RUNNING))
    logp = jnp.zeros((b, s.out_size if s.logprobs else 0), jnp.float32)
    if s.logprobs:
        logp = logp.at[:, 0].set(_token_logp(last_logits, first))
    carry = Carry(
        state=state,
        pending=first,
        pstate=pstate,
        out=jnp.zeros((b, s.out_size), jnp.int32).at[:, 0].set(first),
        count=count,
        stop=stages.check_capacity(s, state.lengths, stop),
        accepts=jnp.full((s.out_size, b), -1, jnp.int32),
        step=jnp.int32(0),
        draws=draws,
        logp=logp,
        node=jnp.full((b,), -1, jnp.int32),
        limits=limits,
        policy=adaptive.init_policy(b, s.k),
        drafted=jnp.full((s.out_size, b), -1, jnp.int32),
    )
    return _constrain(s, carry)


def step(s: ProgramKey, params, pparams, max_new, eos, c: Carry) -> Carry:
    """One verify step: propose → verify → accept → commit → emit → update."""
    b = c.pending.shape[0]
    active = c.stop == RUNNING
    step_draws = c.draws.fold(c.step)
    proposal = budget = m = None
    drafts = q = jnp.zeros((b, 0), jnp.int32)
    if s.proposer is not None:
        args = (s, params, pparams, c.pstate, c.state, c.pending, active, step_draws.fold(PROPOSE))
        if s.adaptive:
            budget = Budget(c.limits.p_min, c.policy.k_cap, active)
            proposal = s.proposer.propose(*args, budget=budget)
        else:
            proposal = s.proposer.propose(*args)
        drafts, q = proposal.drafts, proposal.q
    if budget is not None:
        m = adaptive.draft_count(proposal.conf, s.k, c.limits, c.policy, active)
    state = c.state if proposal is None or proposal.state is None else proposal.state
    verified = stages.verify(s, params, state, c.pending, drafts, active, m)
    accept_draws = step_draws.fold(ACCEPT)
    node, token = stages.accept(
        s, accept_draws, verified.logits, c.pending, drafts, q, m, ids=verified.ids
    )
    accepted = stages.depth(s, node)
    n = jnp.where(active, accepted + 1, 0)
    state = stages.commit(s, state, verified, node, n)
    # from here on, the accepted path's rows: a chain's shapes
    drafts = stages.path_drafts(s, node, c.pending, drafts)
    hidden = stages.along_path(s, node, verified.hidden)
    em = stages.emit(s, c.out, c.count, c.stop, drafts, accepted, token, n, max_new, eos)
    logp = c.logp
    if s.logprobs:
        logits = stages.along_path(s, node, verified.logits)
        logp = stages.write_rows(s, logp, _token_logp(logits, em.tokens), em.index)
    pstate = c.pstate
    if s.proposer is not None:
        done = Committed(state, hidden, em.tokens, n, node)
        pstate, state = s.proposer.update(
            s, params, pparams, c.pstate, proposal.scratch, done, step_draws.fold(UPDATE)
        )
    carry = Carry(
        state=state,
        pending=jnp.where(active, token, c.pending),
        pstate=pstate,
        out=em.out,
        count=em.count,
        stop=stages.check_capacity(s, state.lengths, em.stop),
        accepts=c.accepts.at[c.step].set(jnp.where(active, accepted, -1)),
        step=c.step + 1,
        draws=c.draws,
        logp=logp,
        node=jnp.where(active, node, -1),
        limits=c.limits,
        policy=c.policy
        if m is None
        else adaptive.update_policy(c.policy, c.limits, s.k, accepted, m, active),
        drafted=c.drafted.at[c.step].set(jnp.where(active, s.k if m is None else m, -1)),
    )
    return _constrain(s, carry)


def run(s: ProgramKey, params, pparams, prompts, lengths, max_new, eos, draws, limits):
    """Prefill and the whole loop; returns (out, count, stop, accepts, steps, logp, drafted)."""
    carry = prefill(s, params, pparams, prompts, lengths, max_new, eos, draws, limits)

    def cond(c):
        return (c.step < s.out_size) & jnp.any(c.stop == RUNNING)

    carry = jax.lax.while_loop(cond, lambda c: step(s, params, pparams, max_new, eos, c), carry)
    c = carry
    return c.out, c.count, c.stop, c.accepts, c.step, c.logp, c.drafted


run_jit = compiled.jit(run, static_argnums=0)
prefill_jit = compiled.jit(prefill, static_argnums=0)
step_jit = compiled.jit(step, static_argnums=0)
PARTS = {"run": run_jit, "prefill": prefill_jit, "step": step_jit}  # what ``ProgramCache`` compiles


log = logging.getLogger(__name__)

# XLA options for the compiled decoding programs on CPU. XLA's tree-reduction rewrite splits every
# reduction longer than 32 elements into a reduce-window and a reduce, neither fused with the
# squares before them, so each RMS or L2 norm of a decode step ran as ~4 thunks: ~70
# reduce-windows per MTP k = 3 iteration, at ~1.5 µs each. Without
# it a norm is one fusion. Decoding's reductions are short (a hidden or head width, the
# vocabulary), where a plain vectorised reduce loses no precision that matters; training and
# ``forward`` keep XLA's defaults.
CPU_COMPILER_OPTIONS = {"xla_disable_hlo_passes": "tree_reduction_rewriter"}


def compiler_options() -> dict | None:
    """The XLA options a decoding program is compiled with on this backend."""
    return CPU_COMPILER_OPTIONS if jax.default_backend() == "cpu" else None


# Above this share of the kernel's limit on memory mappings, the next compile first releases every
# compiled program (see ``relieve_map_pressure``).
MAP_HEADROOM = 0.7


def live_mappings() -> tuple[int, int] | None:
    """(memory mappings this process holds, the kernel's per-process limit vm.max_map_count) on
    Linux; None where /proc does not say.

    Why it matters: XLA's CPU compiler maps each compiled kernel's code and data separately —
    about 700 mappings per compiled decoding program of a small model (BUILD_NOTES.md,
    2026-12-02) — so a process that keeps ~90 such programs alive reaches Linux's default limit
    of 65530, after which the next compile fails inside XLA and the failure's C++ exception
    crashes the process (SIGSEGV / SIGABRT in the unwinder) instead of raising."""
    try:
        with open("/proc/self/maps", "rb") as f:
            count = sum(1 for _ in f)
        with open("/proc/sys/vm/max_map_count") as f:
            limit = int(f.read().strip())
    except (OSError, ValueError):
        return None
    return count, limit


def release_compiled() -> None:
    """Drop every compiled program of mtpspec's (``CACHE`` and the jitted functions registered
    in ``mtpspec.compiled``), then collect: their executables' code and data are unmapped.
    Later calls compile again. The user's own jitted functions keep theirs."""
    compiled.release()


def relieve_map_pressure() -> bool:
    """Before a compile: when this process holds more than ``MAP_HEADROOM`` of the kernel's limit
    on memory mappings, ``release_compiled`` (logging a warning) so the compile cannot fail for
    want of one; only mtpspec's own programs are released (the rest of the process's are not
    mtpspec's to drop). Returns whether it released."""
    maps = live_mappings()
    if maps is None or maps[0] <= MAP_HEADROOM * maps[1]:
        return False
    log.warning(
        "this process holds %d memory mappings, %.0f%% of the kernel's limit "
        "(vm.max_map_count = %d); XLA's CPU compiler maps every compiled program's kernels "
        "separately, so mtpspec's compiled programs are released before compiling another",
        maps[0],
        100 * maps[0] / maps[1],
        maps[1],
    )
    release_compiled()
    return True


def lower(s: ProgramKey, args, part: str = "run") -> jax.stages.Lowered:
    """``part`` of the program for ``s`` lowered for ``args``, traced under the kernels'
    settings of ``s.backend`` (what the C++ kernels' calls read while tracing)."""
    with settings.use(s.backend.kernels):
        return PARTS[part].lower(s, *args)


class ProgramCache:
    """Compiled ``run`` programs, least recently used evicted beyond ``maxsize``.

    Key: (ProgramKey, the param tree's structure, (shape, dtype) of every argument leaf). The
    ProgramKey holds the bucketed prompt length and max_new_tokens (through ``out_size`` and the
    prompt array's shape), so nearby requests share an entry. ``compiles`` counts every compile
    in this process (evictions do not lower it). Safe under threads: one lock serialises lookups
    and compiles, so two threads that need the same program compile it once."""

    def __init__(self, maxsize: int = 32):
        self.maxsize = maxsize
        self.compiles = 0
        self._entries: collections.OrderedDict = collections.OrderedDict()
        self._lock = threading.RLock()

    @staticmethod
    def signature(s: ProgramKey, args, options: dict | None) -> tuple:
        """What makes two programs one: the key, the weights' tree, every argument's shape and
        dtype, and the XLA ``options`` it is compiled with (changed options: another program)."""
        leaves = jax.tree.leaves(args)
        return (
            s,
            jax.tree.structure(args[0]),
            tuple((x.shape, str(x.dtype)) for x in leaves),
            tuple(sorted((options or {}).items())),
        )

    def __contains__(self, sig) -> bool:
        return sig in self._entries

    def get(self, s: ProgramKey, args, part: str = "run"):
        """(compiled program, compiled now?) for these static settings and arguments. ``part``:
        "run" (prefill and the whole loop: ``generate``), or "prefill" / "step" (one stage, as
        ``Prepared.prefill`` / ``.step`` run it, with ``args`` as that function takes them):
        every part is compiled with the same options, cached and counted here."""
        if part not in PARTS:
            raise ValueError(f"unknown program part {part!r}; expected one of {tuple(PARTS)}")
        options = compiler_options()  # read once: the entry is keyed on what it compiles with
        sig = self.signature(s, args, options)
        sig = sig if part == "run" else (part, *sig)
        with self._lock:
            if sig in self._entries:
                self._entries.move_to_end(sig)
                return self._entries[sig], False
            relieve_map_pressure()
            program = lower(s, args, part).compile(compiler_options=options)
            compiled.return_freed_memory()  # the compile's working memory, freed
            self.compiles += 1
            self._entries[sig] = program
            while len(self._entries) > self.maxsize:
                self._entries.popitem(last=False)
            return program, True

    def resize(self, maxsize: int) -> None:
        if isinstance(maxsize, bool) or not isinstance(maxsize, int) or maxsize < 1:
            raise ValueError(f"the compile cache size must be an int >= 1, got {maxsize!r}")
        with self._lock:
            self.maxsize = maxsize
            while len(self._entries) > maxsize:
                self._entries.popitem(last=False)

    def clear(self) -> None:
        with self._lock:
            self._entries.clear()

    def __len__(self) -> int:
        return len(self._entries)


CACHE = compiled.register(ProgramCache())


class Program(NamedTuple):
    """One decoding program, built from its key: the window it verifies, the options it is
    compiled with, and its parts — ``run`` (prefill and the whole loop: ``generate``),
    ``prefill`` and ``step`` (one verify step, exactly the loop's body: ``generate_stream``).
    Every part is lowered under ``key.backend``'s kernel settings, compiled with
    ``compiler_options``, and cached and counted in ``cache`` (``CACHE`` by default), so a part
    is the same compiled code whichever entry point reaches it.

        prog = Program(key)
        out = prog.run(args)            # args: (params, pparams, prompts, lengths, max_new,
        carry = prog.prefill(args)      #        eos, draws, limits)
        carry = prog.step(args, carry)
    """

    key: ProgramKey
    cache: ProgramCache = CACHE

    @property
    def window(self):
        """The verify window (``decoding.window``): the tree, the chain of k, or None (plain)."""
        from mtpspec.decoding.window import window

        return window(self.key)

    @property
    def compiler_options(self) -> dict | None:
        return compiler_options()

    def lower(self, args, part: str = "run") -> jax.stages.Lowered:
        return lower(self.key, args, part)

    def compiled(self, args, part: str = "run"):
        """(the compiled ``part`` for these arguments, whether this call compiled it)."""
        return self.cache.get(self.key, args, part)

    def run(self, args):
        """Prefill and loop: (out, count, stop, accepts, steps, logp, drafted)."""
        return self.compiled(args)[0](*args)

    def prefill(self, args) -> Carry:
        return self.compiled(args, "prefill")[0](*args)

    @staticmethod
    def step_args(args, carry: Carry) -> tuple:
        """The step's arguments from the call's: (params, pparams, max_new, eos, carry)."""
        params, pparams, _, _, max_new, eos, _, _ = args
        return (params, pparams, max_new, eos, carry)

    def step(self, args, carry: Carry) -> Carry:
        step_args = self.step_args(args, carry)
        return self.compiled(step_args, "step")[0](*step_args)
