"""Timing on shared, noisy machines: medians, round-robin interleaving, pieces run inside one
jitted on-device loop (as generate's loop runs them), and JAX compile counting."""

from __future__ import annotations

import os
import statistics
import time
from collections.abc import Callable, Sequence

import jax
import jax.numpy as jnp
import numpy as np

from mtpspec.models.inference import Linear, resolve_linear


def median_seconds(fn: Callable, *args, repeats: int = 20, warmup: int = 2) -> float:
    """Median wall time of ``fn(*args)`` (blocked until ready) over ``repeats`` calls."""
    if repeats < 1:
        raise ValueError(f"repeats must be >= 1, got {repeats}")
    for _ in range(max(warmup, 1)):
        jax.block_until_ready(fn(*args))
    times = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        jax.block_until_ready(fn(*args))
        times.append(time.perf_counter() - t0)
    return statistics.median(times)


class CompileCounter:
    """Counts XLA backend compilations while active (``with CompileCounter() as c: ...; c.count``).

    Listens to JAX's own compile event, so it sees every compile in the process (jit caches, AOT
    ``lower().compile()``, anything), not only the generate-program cache."""

    EVENT = "/jax/core/compile/backend_compile_duration"
    _active: list[CompileCounter] = []
    _registered = False

    def __init__(self):
        self.count = 0

    @classmethod
    def _on_duration(cls, event: str, duration: float, **kwargs) -> None:
        if event == cls.EVENT:
            for counter in cls._active:
                counter.count += 1

    def __enter__(self):
        if not CompileCounter._registered:
            jax.monitoring.register_event_duration_secs_listener(CompileCounter._on_duration)
            CompileCounter._registered = True
        CompileCounter._active.append(self)
        return self

    def __exit__(self, *exc):
        CompileCounter._active.remove(self)
        return False


def _ticks() -> tuple[int, int]:
    """(busy ticks of the whole machine, steal included; this process's user + system ticks)."""
    with open("/proc/stat") as f:
        cpu = [int(x) for x in f.readline().split()[1:]]
    busy = sum(cpu) - cpu[3] - cpu[4]  # all but idle and iowait
    with open("/proc/self/stat") as f:
        fields = f.read().rsplit(")", 1)[1].split()
    return busy, int(fields[11]) + int(fields[12])


class MachineLoad:
    """The share of the machine's CPU time that went to other processes (and hypervisor steal)
    while active: ``with MachineLoad() as load: ...; load.other`` (0.25 = a quarter of all cores'
    time). Read from ``/proc/stat`` and ``/proc/self/stat`` tick counters, so good to a few
    percent (it can read slightly below 0 on a quiet machine); NaN where ``/proc`` is missing."""

    def __init__(self):
        self.other = float("nan")

    def __enter__(self):
        self._t0 = time.perf_counter()
        self._start = _ticks() if os.path.exists("/proc/stat") else None
        return self

    def __exit__(self, *exc):
        if self._start is not None:
            end, wall = _ticks(), time.perf_counter() - self._t0
            other = (end[0] - self._start[0]) - (end[1] - self._start[1])
            hz, cores = os.sysconf("SC_CLK_TCK"), os.cpu_count() or 1
            self.other = other / (hz * max(wall, 1e-9) * cores)
        return False


def loop_job(body: Callable, consts, carry, *, iters: int = 64) -> Callable[[], None]:
    """A zero-argument callable running ``carry = body(consts, carry)`` ``iters`` times inside one
    jitted ``lax.fori_loop`` (compiled and run once here), blocking until done.

    This is how the generate loop pays for a piece: on device, without a Python dispatch per call
    (which alone costs more than a whole step of a small model on CPU). ``consts`` (weights, saved
    window data) are arguments, never baked-in constants. ``body`` must make the next iteration's
    inputs depend on this one's outputs, so that XLA can neither hoist the work out of the loop
    nor drop it as dead."""
    run = jax.jit(lambda x, c: jax.lax.fori_loop(0, iters, lambda i, c: body(x, c), c))
    jax.block_until_ready(run(consts, carry))

    def call():
        jax.block_until_ready(run(consts, carry))

    return call


def interleaved_medians(jobs: dict[str, Callable[[], None]], *, repeats: int = 7) -> dict:
    """Median wall seconds of each zero-argument job, timed round-robin (every repeat runs every
    job once), so slow phases of a shared machine (we saw the same program drift between 1.4 and
    0.7 ms per call within one second) hit all jobs alike instead of whichever ran then."""
    if repeats < 1:
        raise ValueError(f"repeats must be >= 1, got {repeats}")
    times: dict[str, list[float]] = {name: [] for name in jobs}
    for _ in range(repeats):
        for name, job in jobs.items():
            t0 = time.perf_counter()
            job()
            times[name].append(time.perf_counter() - t0)
    return {name: statistics.median(v) for name, v in times.items()}


def matmul_row_scaling(
    d_in: int,
    d_out: int,
    rows: Sequence[int],
    *,
    iters: int = 300,
    repeats: int = 15,
    linear: str = "xla",
) -> dict[int, float]:
    """Seconds per [t, d_in] @ [d_in, d_out] @ [d_out, d_in] pair for each t in ``rows``, run in a
    jitted loop (fastest of ``repeats``, interleaved across t so noise hits all alike).

    The physics behind ``verify_over_step``: when the weights sit in cache, a product with t rows
    costs ~t times a 1-row one (compute-bound), and a (k+1)-token window cannot be nearly free as
    it is on a memory-bound accelerator. ``linear``: "xla" (XLA's dot) or "ffi" (the C++ CPU
    kernel, ``kernels.cpu_linear``, on weights packed once)."""
    w1 = jax.random.normal(jax.random.key(0), (d_in, d_out), jnp.float32) / np.sqrt(d_in)
    w2 = jax.random.normal(jax.random.key(1), (d_out, d_in), jnp.float32) / np.sqrt(d_out)
    if linear not in ("xla", "ffi"):
        raise ValueError(f"linear must be 'xla' or 'ffi', got {linear!r}")
    resolve_linear(linear)  # an explicit "ffi" raises here when the kernel cannot run
    w1, w2 = Linear.of(w1, linear), Linear.of(w2, linear)

    def body(w, x):
        return jnp.tanh(w[1](w[0](x)))

    run = jax.jit(lambda w, x: jax.lax.fori_loop(0, iters, lambda i, x: body(w, x), x))
    xs = {t: jnp.full((1, t, d_in), 0.1, jnp.float32) for t in rows}
    for x in xs.values():
        jax.block_until_ready(run((w1, w2), x))
    best = {t: float("inf") for t in rows}
    for _ in range(repeats):
        for t, x in xs.items():
            t0 = time.perf_counter()
            jax.block_until_ready(run((w1, w2), x))
            best[t] = min(best[t], (time.perf_counter() - t0) / iters)
    return best
