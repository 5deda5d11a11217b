"""``Backend``: how one decoding program computes — resolved once, before tracing, and part of its
program key.

    backend = resolve(config, linear="ffi", attention="auto", verify_method="auto",
                      window=k + 1, prefill=p_pad, sharded=False)
    backend.linear       # "ffi" | "xla": the matrices (the C++ linear on packed weights, or XLA)
    backend.attention    # "ffi" | "xla": decode steps' and verify windows' attention
    backend.verify       # the GDN form of the verify window ("ffi", "recurrent", "chunk", ...;
                         # "auto" only off CPU: gated_delta_rule picks Pallas by the dtypes)
    backend.prefill      # the GDN form of the prefill
    backend.kernels      # kernels.settings.KernelSettings (ISA resolved, threads, prefetch)
    backend.native       # the window's GDN runs the C++ kernel: so do the tree window and the
                         # "replay" commit

Every "auto" is resolved (``linear`` by the caller, before: it decides the compute config) and
logged once with its reason by the op's own api module (``models.inference.resolve_linear`` /
``resolve_attention``, ``ops.gdn_method_for``); an explicit choice that cannot run raises
(ValueError / OSError) there, before anything compiles.
The kernels' settings are the ones in effect when ``prepare`` runs (``kernels.settings.use`` or
the MTPSPEC_CPU_* environment): decoding traces and compiles its programs under this value, so
changing them later selects another program instead of reusing one compiled under the old
values.

The weights' layout follows ``linear`` / ``attention`` (``models.inference``: packed ``Linear``
leaves, the ``AttentionCore`` marker), so a decoding tree made for one backend is made again, or
refused, for another.
"""

from __future__ import annotations

import dataclasses
import functools
import logging

from mtpspec import ops
from mtpspec.config import ModelConfig
from mtpspec.kernels import settings
from mtpspec.kernels.settings import KernelSettings
from mtpspec.models.inference import resolve_attention

IMPLS = ("xla", "ffi")
log = logging.getLogger(__name__)


@dataclasses.dataclass(frozen=True)
class Backend:
    """The resolved implementation choices of one decoding program (hashable, equal by value)."""

    linear: str = "xla"
    attention: str = "xla"
    verify: str = "recurrent"
    prefill: str = "chunk"
    kernels: KernelSettings = dataclasses.field(default_factory=settings.current)

    def __post_init__(self):
        for name in ("linear", "attention"):
            if getattr(self, name) not in IMPLS:
                raise ValueError(
                    f"Backend.{name} must be one of {IMPLS}, got {getattr(self, name)!r}"
                )
        for name in ("verify", "prefill"):
            if getattr(self, name) not in ops.GDN_METHODS:
                raise ValueError(
                    f"Backend.{name} must be a GDN form {ops.GDN_METHODS}, "
                    f"got {getattr(self, name)!r}"
                )
        if not isinstance(self.kernels, KernelSettings) or self.kernels.isa == "auto":
            raise ValueError(
                f"Backend.kernels must be resolved KernelSettings, got {self.kernels!r}"
            )

    @property
    def native(self) -> bool:
        """Whether the verify window's GDN runs the C++ kernel: then a tree window's GDN and the
        "replay" commit run theirs too (the same recurrence, bit for bit)."""
        return self.verify == "ffi"


def window_gdn_method(config: ModelConfig, method: str, t: int, *, sharded: bool) -> str:
    """The GDN form a t-token decoding window (verify window or prefill) runs
    (``ops.gdn_method_for`` as decoding asks it: the native kernel allowed, for this model's head
    size). It stays "auto" only where ``gated_delta_rule`` chooses per call from the operands'
    dtypes (off CPU, without a mesh: Pallas or XLA)."""
    state = config.linear_key_head_dim * config.linear_value_head_dim
    return ops.gdn_method_for(method, t, sharded=sharded, native=True, head_state=state)


def resolve(
    config: ModelConfig,
    *,
    linear: str,
    attention: str,
    verify_method: str,
    window: int,
    prefill: int,
    sharded: bool,
) -> Backend:
    """The ``Backend`` of a decoding call: ``linear`` as the caller resolved it
    (``models.inference.resolve_linear``, or a ``DecodingWeights``' own: it decides the compute
    ``config``), ``attention``, ``verify_method`` for a ``window``-row verify window, the
    prefill's GDN form for ``prefill`` rows, and the kernels' settings in effect. ``config``: the
    config decoding computes with."""
    backend = Backend(
        linear=linear,
        attention=resolve_attention(attention, sharded=sharded, cache_dtype=config.dtype),
        verify=window_gdn_method(config, verify_method, window, sharded=sharded),
        prefill=window_gdn_method(config, "auto", prefill, sharded=sharded),
        kernels=settings.current(),
    )
    if "ffi" in (backend.linear, backend.attention, backend.verify, backend.prefill):
        _log_kernels(backend.kernels)
    return backend


@functools.lru_cache(maxsize=64)
def _log_kernels(ks: KernelSettings) -> None:
    log.info("C++ CPU kernels: %s", ks)
