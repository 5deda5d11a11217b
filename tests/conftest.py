"""Test-session set-up: a persistent XLA compilation cache shared by the pytest-xdist workers.

Many tests compile the very same generate/forward programs (same config, same shapes); with the
cache, the second worker to need one loads it instead of compiling again. Results are identical
(the cache stores the compiled executable of the same HLO); only wall time changes.
"""

from __future__ import annotations

import os
import pathlib

# Two optimisation levels. The decoding programs (everything ``generate``, ``prepare`` and
# ``Program`` compile, through ``program.CPU_COMPILER_OPTIONS``) compile at XLA's default level,
# 3 — the code users run — so every spec == greedy, commit and kernel-in-the-loop oracle is a
# statement about that code. Everything else in this process (the oracles' own forward passes,
# op-by-op jits, training steps) compiles at LLVM -O0, about half the compile time: those are
# the slow, obviously-correct side of each comparison. Set before the backend starts;
# subprocesses (the 8-device suite, notebooks, the CLIs) inherit -O0 for all their programs.
# Opt out by setting any --xla_backend_optimization_level in XLA_FLAGS yourself.
SUITE_O0 = "--xla_backend_optimization_level=0"
USERS_LEVEL = {"xla_backend_optimization_level": 3}  # XLA's default (DebugOptions)
ADDED_O0 = "xla_backend_optimization_level" not in os.environ.get("XLA_FLAGS", "")
if ADDED_O0:
    os.environ["XLA_FLAGS"] = (os.environ.get("XLA_FLAGS", "") + " " + SUITE_O0).strip()

import jax  # noqa: E402
import pytest  # noqa: E402

# MTPSPEC_TEST_JAX_CACHE=off runs without it. (It was off by default from 2026-12-01 to 12-03:
# a worker had died in JAX's CPU executable serialization while writing an entry — the worker was
# out of memory mappings, the cause of every such crash, fixed by the module fixture below.)
_CACHE_SETTING = os.environ.get(
    "MTPSPEC_TEST_JAX_CACHE", str(pathlib.Path(__file__).parent.parent / ".jax_cache")
)
if ADDED_O0:
    from mtpspec.decoding import program as _program

    _program.CPU_COMPILER_OPTIONS.update(USERS_LEVEL)


def users_jit(fun, **kw):
    """``jax.jit(fun)`` compiled at XLA's default level (``USERS_LEVEL``), for an exactness
    oracle that calls decoding's pieces (a commit, a window) outside a decoding program."""
    return jax.jit(fun, compiler_options=USERS_LEVEL if ADDED_O0 else None, **kw)


# Programs that took over 50 ms to compile go to the cache: the subprocesses (CLIs, training
# runs, notebooks) share the small ones too (0.5 s before: the six longest subprocess tests
# took 94 s at 0.5, 87 s at 0.05 and at 0; BUILD_NOTES, twenty-second session).
CACHE_MIN_SECS = os.environ.get("MTPSPEC_TEST_CACHE_MIN_SECS", "0.05")

if _CACHE_SETTING != "off":
    jax.config.update("jax_compilation_cache_dir", _CACHE_SETTING)
    jax.config.update("jax_persistent_cache_min_compile_time_secs", float(CACHE_MIN_SECS))
    jax.config.update("jax_persistent_cache_min_entry_size_bytes", 0)


def subprocess_env(*, optimised: bool = False) -> dict[str, str]:
    """The environment for a subprocess the suite starts (a training run, a notebook kernel):
    this one's, on the CPU (``JAX_PLATFORMS=cpu``: the suite's results are CPU results), plus the
    suite's compilation cache and its thresholds through JAX_* variables, and without the suite's
    LLVM -O0 when ``optimised`` (compute-bound runs; only if the suite added it)."""
    env = {**os.environ, "JAX_PLATFORMS": "cpu"}
    if _CACHE_SETTING != "off":
        env.update(
            JAX_COMPILATION_CACHE_DIR=_CACHE_SETTING,
            JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS=CACHE_MIN_SECS,
            JAX_PERSISTENT_CACHE_MIN_ENTRY_SIZE_BYTES="0",
        )
    if optimised and ADDED_O0:
        env["XLA_FLAGS"] = env["XLA_FLAGS"].replace(SUITE_O0, "").strip()
    return env


def tiny_training_run(seq_len: int = 16):
    """(config, corpus, TrainConfig) of a tiny training run the reliability tests resume and
    break: a 2-layer hybrid with a 128-token vocabulary on 4,000 random training and 800
    held-out tokens, 3 steps of batch 2, a checkpoint every step."""
    import numpy as np

    from mtpspec import config as C
    from mtpspec.training import TrainConfig
    from mtpspec.training import data as data_lib

    config = C.tiny_hybrid(vocab_size=128, layer_types=(C.LINEAR, C.FULL), mlp_types=("dense",) * 2)
    rng = np.random.default_rng(5)
    corpus = data_lib.Corpus(
        rng.integers(0, 128, 4000).astype(np.uint8), rng.integers(0, 128, 800).astype(np.uint8), []
    )
    tc = TrainConfig(steps=3, batch=2, seq_len=seq_len, warmup=1, save_every=1, eval_every=3,
                     eval_batches=1, log_every=1)  # fmt: skip
    return config, corpus, tc


# The 8-device sharding tests run in their own process (tests/test_sharding.py starts it with
# MTPSPEC_MULTIDEVICE=1 and 8 simulated CPU devices); the main session does not collect them.
collect_ignore = [] if os.environ.get("MTPSPEC_MULTIDEVICE") == "1" else ["multidevice"]


# A module's end releases only once the worker holds this fraction of the limit: the tests' own
# small programs (eager ops, oracles' jits) then stay compiled across modules (releasing at every
# module end recompiled them, ~15 % of the suite's time; BUILD_NOTES, twenty-second session). In
# a whole-suite run a module added at most 15,653 mappings and the peak at a module's end was
# 34,884 of 65,530; the library's own relief (70 % of the limit, before each compile) is the
# backstop (MTPSPEC_TEST_MAPS_LOG logs the count at each module end).
RELEASE_AT = float(os.environ.get("MTPSPEC_TEST_RELEASE_AT", "0.4"))


@pytest.fixture(autouse=True, scope="module")
def _release_compiled_programs_after_each_module(request):
    """Free every compiled program when a test module ends with the worker holding more than
    ``RELEASE_AT`` of its memory-mapping limit. XLA's CPU compiler keeps ~700 memory mappings per
    compiled decoding program, and an xdist worker that kept every module's programs reached
    Linux's vm.max_map_count (65530) mid-suite: the next compile failed inside XLA and the
    worker died in the C++ unwinder (the SIGSEGV / SIGABRT "crashes in XLA's compile" of
    2026-12-01/02; a core dump showed 64,907 mappings; BUILD_NOTES.md 2026-12-02)."""
    yield
    from mtpspec.decoding import program

    log = os.environ.get("MTPSPEC_TEST_MAPS_LOG")  # a file: "pid mappings limit module" lines
    maps = program.live_mappings()
    if log and maps is not None:
        with open(log, "a") as f:
            f.write(f"{os.getpid()} {maps[0]} {maps[1]} {request.module.__name__}\n")
    if maps is not None and maps[0] < RELEASE_AT * maps[1]:
        return
    program.release_compiled()
    jax.clear_caches()  # the tests' own jitted functions too (the suite's process is its own)


def pytest_collection_modifyitems(config, items):
    """The tests marked ``slow(seconds)`` run first, longest first, and the rest in collection
    order: with ``make test``'s ``--maxschedchunk=2`` the xdist workers take tests two at a time
    from the front, so the long subprocess tests (the 8-device suite, the notebooks, the training
    runs) start on both workers at once instead of one of them ending the run alone (longest
    processing time first). The order is the same on every worker, as xdist requires."""

    def seconds(item):
        mark = item.get_closest_marker("slow")
        return -float(mark.args[0]) if mark is not None and mark.args else 0.0

    items.sort(key=seconds)  # stable: unmarked tests keep their order
