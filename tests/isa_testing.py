"""Running a jitted kernel call under one instruction set (``kernels.settings``), for the tests
that compare the AVX2 and AVX-512 loops of the C++ kernels."""

from __future__ import annotations

import jax
import numpy as np

from mtpspec.kernels import cpu_linear, settings


def with_isa(isa: str, fn, *args):
    """``jax.jit(fn)(*args)`` as numpy under ``settings.use(KernelSettings(isa=isa))``, after
    checking that the lowered program passes that instruction set to the kernel."""
    jitted = jax.jit(fn)
    with settings.use(settings.KernelSettings(isa=isa)):
        assert f"isa = {cpu_linear.isa_code(isa)} : i64" in jitted.lower(*args).as_text()
        return jax.tree.map(np.asarray, jitted(*args))
