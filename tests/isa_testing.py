"""Running a jitted kernel call under one instruction set (``cpu_linear.ISA``), for the tests
that compare the AVX2 and AVX-512 loops of the C++ kernels."""

from __future__ import annotations

import jax
import numpy as np

from mtpspec.kernels import cpu_linear


def with_isa(monkeypatch, isa: str, fn, *args):
    """``jax.jit(fn)(*args)`` as numpy with ``cpu_linear.ISA = isa``, after checking that the
    lowered program passes that instruction set to the kernel."""
    monkeypatch.setattr(cpu_linear, "ISA", isa)
    jitted = jax.jit(fn)
    assert f"isa = {cpu_linear.isa_code(isa)} : i64" in jitted.lower(*args).as_text()
    return jax.tree.map(np.asarray, jitted(*args))
