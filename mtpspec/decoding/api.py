"""Public entry points: ``generate`` (one jitted program), ``generate_stream`` (the same prefill and
step from Python), and ``prepare`` (the checked, placed call as an object that can be lowered,
compiled, run or stepped: for sharding reports, multi-device tests and notebooks)."""

from __future__ import annotations

import numbers
import time
from collections.abc import Iterator, Sequence
from typing import NamedTuple

import jax
import numpy as np

from mtpspec import sharding
from mtpspec.config import ModelConfig
from mtpspec.decoding import host, program
from mtpspec.decoding.program import CACHE, Carry, ProgramKey
from mtpspec.decoding.spec import SpecConfig
from mtpspec.decoding.stages import RUNNING, STOP_NAMES
from mtpspec.decoding.stats import result_stats
from mtpspec.models import inference


class GenerateResult(NamedTuple):
    tokens: list[list[int]]  # emitted ids per prompt (eos included when hit)
    stop_reasons: list[str]  # "eos" | "length" | "capacity" per prompt
    stats: dict  # acceptance and timing figures (see ``generate``)
    # with return_logprobs=True: per prompt, log p(token) of each emitted token under the target
    # model's own next-token distribution (log softmax of its logits: temperature 1, no filters)
    logprobs: list[list[float]] | None = None


class Prepared(NamedTuple):
    """A checked decoding call with its arguments on the device(s).

    ``key`` selects the compiled program; ``args`` = (params, proposer params, prompts, lengths,
    max_new, eos ids, draws: per-row keys and sampling settings, limits: the call's p_min and
    adaptive flag); ``n`` real sequences (the rest
    pads the batch to the mesh's data axis); ``max_new_tokens`` as asked (the program's buffer is
    its bucket)."""

    key: ProgramKey
    args: tuple
    n: int
    max_new_tokens: int

    @property
    def program(self) -> program.Program:
        """The program this call runs (``program.Program``: its parts, options and cache)."""
        return program.Program(self.key)

    def lower(self) -> jax.stages.Lowered:
        """The whole program (prefill + loop), lowered for these argument shapes."""
        return self.program.lower(self.args)

    def compiled(self):
        """(the cached compiled program, whether it was compiled by this call)."""
        return self.program.compiled(self.args)

    def prefill(self) -> Carry:
        """The prefill: the loop carry before the first verify step (compiled with the options
        ``generate`` uses, cached and counted like its programs)."""
        return self.program.prefill(self.args)

    def step(self, carry: Carry) -> Carry:
        """One verify step (exactly the loop's body), compiled, cached and counted as
        ``prefill``."""
        return self.program.step(self.args, carry)


def prepare(
    config: ModelConfig,
    params,
    prompts: list[list[int]],
    *,
    max_new_tokens: int,
    speculative: SpecConfig | None = None,
    temperature: float | Sequence[float] = 0.0,
    top_k: int | Sequence[int] = 0,
    top_p: float | Sequence[float] = 1.0,
    min_p: float | Sequence[float] = 0.0,
    seed: int | Sequence[int] = 0,
    eos_id: int | Sequence[int] | None = None,
    return_logprobs: bool = False,
    mesh=None,
    capacity: int | None = None,
    linear: str = "auto",
    attention: str = "auto",
) -> Prepared:
    """Check a decoding call (ValueError / TypeError before any device work) and place its
    arguments on the device(s). ``generate`` and ``generate_stream`` take these same keyword
    arguments:

    max_new_tokens  tokens to emit per prompt (0: nothing runs)
    speculative     None (plain decoding) or a ``SpecConfig`` (proposer, k, commit strategy)
    temperature, top_k, top_p, min_p
                    sampling, each one value or one per prompt (temperature 0: greedy; top_k 0,
                    top_p 1, min_p 0: off; applied in that order, identically to target and
                    draft distributions). They are arrays in the compiled program: changing
                    them never recompiles (only all-greedy vs. not selects another program).
    seed            one int s (prompt i draws with seed s + i) or one int per prompt; a row's
                    draws depend only on its own seed and settings, not on its batch mates
    eos_id          stop a sequence at this token or at the first of these tokens (included in
                    its output, as transformers does); None: only max_new_tokens stops
    return_logprobs also return each emitted token's log-probability under the target model's
                    own distribution (log softmax of its logits, temperature 1, unfiltered)
    mesh            a (data, model) ``jax.sharding.Mesh`` to shard over (``mtpspec.sharding``)
    capacity        KV slots per sequence (default ``default_capacity``: prompt bucket + output
                    bucket + one verify window)
    linear          "auto" | "xla" | "ffi": how the model's matrices are applied while decoding
                    (``models/inference.py``): "ffi" is the C++ CPU kernel for few rows, "xla"
                    XLA's dots; both on projections fused at load. "auto" picks "ffi" on CPU when
                    the kernel is built (and logs its choice); under a mesh only "xla" runs.
    attention       "auto" | "xla" | "ffi": how decode steps and verify windows attend over the
                    KV cache: "ffi" is the C++ CPU kernel (the live prefix only), "xla" XLA's
                    form; chosen like ``linear`` ("auto" also wants a float32 cache). Prefills
                    and windows beyond ``cpu_attention.MAX_T`` (2048) tokens use XLA's form;
                    tree windows (``SpecConfig.tree``) take the kernel's ancestor-mask variant.
    """
    if isinstance(max_new_tokens, numbers.Integral) and not isinstance(max_new_tokens, bool):
        max_new_tokens = int(max_new_tokens)  # NumPy ints too
    sampling = dict(temperature=temperature, top_k=top_k, top_p=top_p, min_p=min_p, seed=seed)
    key, arrays = host.prepare(
        config,
        params,
        prompts,
        max_new_tokens,
        speculative,
        sampling,
        eos_id,
        mesh,
        capacity,
        linear,
        return_logprobs,
        attention,
    )
    pparams = None
    if key.proposer is not None:
        pparams = key.proposer.device_params(speculative, key, params)
    args = host.device_args(key, params, pparams, arrays)
    return Prepared(key, args, len(prompts), max_new_tokens)


def generate(config: ModelConfig, params, prompts: list[list[int]], **options) -> GenerateResult:
    """Plain or speculative decoding of a ragged batch, prefill + loop in one jitted program.

    Keyword arguments (``prepare`` documents each): ``max_new_tokens`` (required),
    ``speculative``, ``temperature``, ``top_k``, ``top_p``, ``min_p``, ``seed``, ``eos_id``,
    ``return_logprobs``, ``mesh``, ``capacity``, ``linear``, ``attention``.

    ``result.stats``: ``steps`` (verify steps per sequence), ``accepted`` (per sequence, per
    step: drafts accepted, −1 when inactive), ``tau`` (emitted tokens per verify step, prefill
    token excluded; ``decoding.stats``), ``position_acceptance`` (fraction of steps accepting
    ≥ i drafts, i = 1..k), ``compile_s``, ``run_s`` (prefill + loop, compile excluded),
    ``tokens_per_s``. Bad arguments raise ValueError / TypeError before any device work;
    capacity overflow stops a sequence with stop reason "capacity" (never wraps around).
    """
    prepared = prepare(config, params, prompts, **options)
    b = prepared.n
    if prepared.max_new_tokens == 0:  # nothing to run; the same statistics, empty
        stats = result_stats(np.zeros((0, b), np.int32), np.zeros(b), prepared.key.k, 0.0, 0.0)
        empty = [[] for _ in range(b)]
        logprobs = [[] for _ in range(b)] if prepared.key.logprobs else None
        return GenerateResult(empty, ["length"] * b, stats, logprobs)
    t0 = time.perf_counter()
    compiled, fresh = prepared.compiled()
    compile_s = time.perf_counter() - t0 if fresh else 0.0
    t0 = time.perf_counter()
    done = jax.block_until_ready(compiled(*prepared.args))
    out, count, stop, accepts, steps, logp, drafted = done
    run_s = time.perf_counter() - t0
    host_ = sharding.to_host
    out, count, stop = host_(out)[:b], host_(count)[:b], host_(stop)[:b]
    accepts = host_(accepts)[: int(host_(steps)), :b]
    drafted = host_(drafted)[: accepts.shape[0], :b]
    tokens = [out[i, : count[i]].tolist() for i in range(b)]
    logprobs = None
    if prepared.key.logprobs:
        logp = host_(logp)[:b]
        logprobs = [logp[i, : count[i]].tolist() for i in range(b)]
    stats = result_stats(accepts, count, prepared.key.k, compile_s, run_s, drafted)
    return GenerateResult(tokens, [STOP_NAMES[int(c)] for c in stop], stats, logprobs)


class StreamStep(NamedTuple):
    """One step of ``stream_steps``: what each sequence emitted in it, and where each stands."""

    tokens: list[list[int]]  # per prompt, this step's tokens (the first step: the prefill token)
    stop_reasons: list[str | None]  # per prompt: None while running, else "eos" | "length" | ...
    step: int  # verify steps run so far (0 for the prefill)


def stream_steps(prepared: Prepared) -> Iterator[StreamStep]:
    """Run a prepared call one verify step at a time from Python: the jitted prefill and step are
    the very functions the on-device loop runs. Stops when every sequence has stopped."""
    if prepared.max_new_tokens == 0:
        return
    carry = prepared.prefill()
    n = prepared.n
    seen = np.zeros(n, np.int64)
    while True:
        count = sharding.to_host(carry.count)[:n]
        out = sharding.to_host(carry.out)[:n]
        stop = sharding.to_host(carry.stop)
        step = int(sharding.to_host(carry.step))
        reasons = [None if c == RUNNING else STOP_NAMES[int(c)] for c in stop[:n]]
        yield StreamStep([out[i, seen[i] : count[i]].tolist() for i in range(n)], reasons, step)
        seen = count
        if not (stop == RUNNING).any() or step >= prepared.key.out_size:
            return
        carry = prepared.step(carry)


def generate_stream(
    config: ModelConfig, params, prompts: list[list[int]], **options
) -> Iterator[list[list[int]]]:
    """Same decoding, one verify step per iteration from Python (for notebooks): yields, per step,
    the tokens each sequence emitted in that step (the first yield is the prefill token). The
    jitted prefill and step are the very functions the on-device loop runs. The same keyword
    arguments as ``generate``; ``stream_steps`` also reports the stop reasons."""
    for item in stream_steps(prepare(config, params, prompts, **options)):
        yield item.tokens


def compile_count() -> int:
    """How many generate programs have been compiled in this process (tests use it)."""
    return CACHE.compiles


def release_compiled(*, weights: bool = False) -> None:
    """Free mtpspec's compiled programs (their memory and the memory mappings XLA's CPU compiler
    holds per program); the next call compiles again. The user's own jitted functions are not
    touched (``jax.clear_caches()`` is never called). With ``weights``, also drop the decoding
    trees made from parameter sets (``models.inference.MEMO``: fused, packed copies of the
    weights); the next call builds its tree again. Programs alone are also released
    automatically before a compile when the process nears the kernel's limit on memory mappings
    (``program.relieve_map_pressure``)."""
    program.release_compiled()
    if weights:
        inference.MEMO.clear()


def set_compile_cache_size(maxsize: int) -> None:
    """Keep at most ``maxsize`` compiled generate programs (least recently used evicted first;
    default 32). Each holds its executable (on CPU: a few MB)."""
    CACHE.resize(maxsize)
