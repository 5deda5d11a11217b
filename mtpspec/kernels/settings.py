"""How the C++ CPU kernels run: instruction set, threads, prefetch distance — one frozen value.

    ks = settings.current()                         # in effect here (resolved: isa never "auto")
    with settings.use(KernelSettings(linear_threads=1, isa="avx2")):
        mtpspec.generate(...)                       # its programs are traced and compiled with it

A kernel wrapper (``cpu_linear.apply``, ``cpu_gdn.apply``, ``cpu_attention.apply``, ...) reads
``current()`` when its call is traced and passes the values as the FFI call's attributes. ``use``
is a JAX user context (``jax.make_user_context``): JAX's trace, lowering and compile caches key on
its value, so a function traced under one setting — a nested jitted helper included — is never
reused under another. Decoding resolves ``current()`` once in ``prepare`` into its ``Backend``
(part of the program key) and traces its programs under that value.

Outside any ``use``, the value comes from the environment, read once at import:
MTPSPEC_CPU_LINEAR_ISA ("auto" | "avx2" | "avx512"; every kernel's instruction set but the
bf16-activation prefill's, which is AVX-512 BF16's),
MTPSPEC_CPU_LINEAR_THREADS, MTPSPEC_CPU_ATTENTION_THREADS, MTPSPEC_CPU_GDN_THREADS (1: the
caller alone; 2: the caller and one helper of XLA's intra-op pool, what the 2-core machines
this is tuned on want) and MTPSPEC_CPU_LINEAR_PREFETCH (packed weight rows, 128 weights each,
prefetched ahead of the FMAs; 0 = off) and MTPSPEC_CPU_PREFILL_ACTIVATIONS ("float32" |
"bfloat16": see ``KernelSettings``). A bad value raises ValueError naming the variable.

Neither the instruction set nor threads nor prefetch change a value: the linear sums each output
in one FMA chain over its inputs in order, and the GDN and attention kernels compute each lane's
row alone, on either ISA (``tests/test_cpu_linear.py`` checks AVX2 against AVX-512 bit for bit);
the settings are still part of each program's key. The exception is opt-in:
``prefill_activations="bfloat16"`` changes the prompt's rows (never a decode step's).
"""

from __future__ import annotations

import contextlib
import dataclasses
import functools
import os
from collections.abc import Iterator, Mapping

import jax
import numpy as np

ISAS = ("auto", "avx2", "avx512")
_ENV = {
    "isa": "MTPSPEC_CPU_LINEAR_ISA",
    "linear_threads": "MTPSPEC_CPU_LINEAR_THREADS",
    "attention_threads": "MTPSPEC_CPU_ATTENTION_THREADS",
    "gdn_threads": "MTPSPEC_CPU_GDN_THREADS",
    "prefetch": "MTPSPEC_CPU_LINEAR_PREFETCH",
    "prefill_activations": "MTPSPEC_CPU_PREFILL_ACTIVATIONS",
}
PREFILL_ACTIVATIONS = ("float32", "bfloat16")
MAX_THREADS = 64


@dataclasses.dataclass(frozen=True)
class KernelSettings:
    """The C++ kernels' run settings (hashable; equal by value).

    isa: "auto" (AVX-512 where the CPU has it, else AVX2), "avx2" or "avx512" (``resolved``
    raises OSError on a CPU without AVX-512F). *_threads: 1..64 threads sharing one call (the
    caller and helpers of XLA's intra-op pool). prefetch: weight rows the linear prefetches
    ahead (0 = off). prefill_activations: "float32" (the default: every row's value is the
    decode step's) or "bfloat16" — the prompt's forward (``prefill_scope``) multiplies bf16-stored
    weights with activations rounded to bf16, through AVX-512 BF16's dot product (``resolved``
    raises OSError on a CPU without it): about twice the multiply-adds per instruction, as
    llama.cpp's bf16 matrices run, at the cost of the prompt's rows no longer being the values a
    decode step would give them (decode steps and verify windows stay float32, so speculative
    greedy still equals plain greedy; the prompt's logits move by the rounding).
    """

    isa: str = "auto"
    linear_threads: int = 2
    attention_threads: int = 2
    gdn_threads: int = 2
    prefetch: int = 64
    prefill_activations: str = "float32"

    def __post_init__(self):
        if not isinstance(self.isa, str) or self.isa not in ISAS:
            raise ValueError(f"unknown kernel isa {self.isa!r}; expected one of {ISAS}")
        if self.prefill_activations not in PREFILL_ACTIVATIONS:
            raise ValueError(
                f"unknown prefill_activations {self.prefill_activations!r}; expected one of "
                f"{PREFILL_ACTIVATIONS}"
            )
        for name in ("linear_threads", "attention_threads", "gdn_threads", "prefetch"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int):
                raise TypeError(f"{name} must be an int, got {type(value).__name__}")
        for name in ("linear_threads", "attention_threads", "gdn_threads"):
            if not 1 <= getattr(self, name) <= MAX_THREADS:
                raise ValueError(f"{name} must be in 1..{MAX_THREADS}, got {getattr(self, name)}")
        if not 0 <= self.prefetch <= 4096:
            raise ValueError(f"prefetch must be in 0..4096 rows, got {self.prefetch}")

    @classmethod
    def from_env(cls, environ: Mapping[str, str] | None = None) -> KernelSettings:
        """The settings the MTPSPEC_CPU_* variables of ``environ`` (default ``os.environ``) ask
        for, the defaults where unset. A bad value raises ValueError naming the variable."""
        environ = os.environ if environ is None else environ
        values: dict = {}
        for field, var in _ENV.items():
            raw = environ.get(var)
            if raw is None or raw == "":
                continue
            if field in ("isa", "prefill_activations"):
                values[field] = raw
                continue
            try:
                values[field] = int(raw)
            except ValueError:
                raise ValueError(f"{var}={raw!r} is not an integer") from None
        try:
            return cls(**values)
        except ValueError as e:
            names = ", ".join(f"{_ENV[f]}={environ[_ENV[f]]!r}" for f in values)
            raise ValueError(f"{e} (from {names})") from None

    def resolved(self) -> KernelSettings:
        """The same with ``isa`` resolved for this CPU ("auto" -> "avx512" or "avx2"); "avx512"
        on a CPU without AVX-512F raises OSError, as does prefill_activations="bfloat16" on one
        without AVX-512 BF16 (or without the kernels' library: the setting is then an error
        wherever settings are resolved, as isa="avx512" is); "bfloat16" with isa="avx2" raises
        ValueError."""
        if self.prefill_activations == "bfloat16" and self.isa == "avx2":
            raise ValueError(
                "prefill_activations='bfloat16' runs AVX-512 BF16 instructions; isa='avx2' "
                "forbids them"
            )
        if self.prefill_activations == "bfloat16" and not has_bf16_dot():
            raise OSError(
                "prefill_activations='bfloat16' needs the C++ kernels on a CPU with AVX-512 BF16 "
                "(vdpbf16ps); this one lacks it"
            )
        if self.isa == "avx2":
            return self
        avx512 = has_avx512()
        if self.isa == "avx512" and not avx512:
            raise OSError(
                "the CPU kernels' isa='avx512' needs a CPU with AVX-512F; this one lacks it"
            )
        return dataclasses.replace(self, isa="avx512" if avx512 else "avx2")

    def attributes(self, kernel: str) -> dict:
        """The FFI attributes a ``kernel`` ("linear", "attention" or "gdn") call passes: its
        thread count and the ISA code (and, for the linear, the prefetch distance), as int64."""
        out = {
            "threads": np.int64(getattr(self, f"{kernel}_threads")),
            "isa": np.int64(self.isa_code),
        }
        if kernel == "linear":
            out["prefetch"] = np.int64(self.prefetch)
            # bf16 activations: asked for, and inside the prompt's forward (the bf16 kernel only)
            bf16 = self.prefill_activations == "bfloat16" and bool(_PREFILL.value)
            out["dot"] = np.int64(bf16)
        return out

    @property
    def isa_code(self) -> int:
        """The kernels' ``isa`` attribute: 0 AVX2, 1 AVX-512 (of the resolved value)."""
        return int(self.resolved().isa == "avx512")


def _cpu_has(probe: str) -> bool:
    """The kernels' library's CPU feature ``probe`` (a C function), False without the library."""
    from mtpspec.kernels import library

    return library.status()[0] and bool(getattr(library.handle(), probe)())


def has_avx512() -> bool:
    """Whether this CPU has AVX-512F (False when the kernels' library is not available)."""
    return _cpu_has("mtpspec_cpu_linear_avx512")


def has_bf16_dot() -> bool:
    """Whether this CPU has AVX-512 BF16 (``vdpbf16ps``) with AVX-512BW/VL (False without the
    kernels' library)."""
    return _cpu_has("mtpspec_cpu_linear_bf16_dot")


@functools.lru_cache(maxsize=1)
def from_environment() -> KernelSettings:
    """``KernelSettings.from_env()`` of the process's environment, resolved (read once)."""
    return KernelSettings.from_env().resolved()


_CONTEXT = jax.make_user_context(None)
_PREFILL = jax.make_user_context(False)


@contextlib.contextmanager
def prefill_scope() -> Iterator[None]:
    """Calls traced in the block are a prompt's forward: with ``prefill_activations="bfloat16"``
    their bf16-weight linears take bf16 activations (decoding's prefill traces under it). A JAX
    user context, like ``use``: programs traced inside and outside it are never mixed up."""
    with _PREFILL(True):
        yield


def current() -> KernelSettings:
    """The settings in effect (resolved): the innermost ``use``, else ``from_environment()``."""
    value = _CONTEXT.value
    return from_environment() if value is None else value


@contextlib.contextmanager
def use(ks: KernelSettings) -> Iterator[KernelSettings]:
    """Run the block with ``ks`` (resolved first: OSError for an ISA this CPU lacks) as the
    kernels' settings; JAX's caches key on it (see the module docstring). Thread-local."""
    if not isinstance(ks, KernelSettings):
        raise TypeError(f"use() takes a KernelSettings, got {type(ks).__name__}")
    ks = ks.resolved()
    with _CONTEXT(ks):
        yield ks
