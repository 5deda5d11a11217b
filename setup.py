"""Build step for the optional C++ kernel (everything else is in setup.cfg).

``mtpspec/kernels/cpu_linear.cc`` (a few-row CPU linear), ``cpu_gdn.cc`` (the gated delta rule
over a short window) and ``cpu_attention.cc`` (attention of a short window over its KV cache), all
called from XLA through ``jax.ffi``, are compiled into one library against the XLA FFI headers
that jaxlib ships (``jax.ffi.include_dir()``), so jax must be
importable when this runs: pyproject.toml's ``[build-system] requires`` has it, so ``pip install
.`` / ``pip install -e .`` / ``pip wheel .`` build them in pip's isolated build environment;
``make install`` installs jax first and builds with ``--no-build-isolation`` (faster, the same
result). The kernels are optional: without a C++ compiler, or if compiling fails, the install
still succeeds without them; at run time ``mtpspec.kernels.library.status()`` (``python -m
mtpspec.kernels``) says why they are missing, decoding's ``"auto"`` choices use XLA instead, and
the first decoding call warns once.
"""

from __future__ import annotations

import os
import sys
from concurrent.futures import ThreadPoolExecutor

from setuptools import Extension, setup
from setuptools.command.build_ext import build_ext


class OptionalBuildExt(build_ext):
    """Build the kernels if possible; never fail the install because of them."""

    def run(self):
        try:
            super().run()
        except Exception as e:  # noqa: BLE001 - any failure leaves the kernel out, loudly
            self._skip(e)

    def build_extension(self, ext):
        self.compiler.compile = _one_process_per_source(self.compiler.compile)
        try:
            super().build_extension(ext)
        except Exception as e:  # noqa: BLE001
            self._skip(e)

    @staticmethod
    def _skip(error):
        print(
            f"mtpspec: the C++ CPU kernels were not built ({error}); "
            "mtpspec runs without them (XLA only)",
            file=sys.stderr,
        )


def _one_process_per_source(compile_sources):
    """``compile_sources`` (a compiler's ``compile``) run on each source file at once, one
    compiler process per file and core: setuptools compiles an extension's sources one after
    another (three kernels of ~4 s each)."""

    def compile_all(sources, *args, **kwargs):
        workers = max(1, min(len(sources), os.cpu_count() or 1))
        with ThreadPoolExecutor(workers) as pool:
            parts = pool.map(lambda source: compile_sources([source], *args, **kwargs), sources)
            return [obj for part in parts for obj in part]

    return compile_all


def _ext_modules():
    try:
        import jax.ffi
    except Exception as e:  # noqa: BLE001
        OptionalBuildExt._skip(f"jax is not importable at build time: {e}")
        return []
    return [
        Extension(
            "mtpspec.kernels._cpu_kernels",
            sources=[
                "mtpspec/kernels/cpu_linear.cc",
                "mtpspec/kernels/cpu_gdn.cc",
                "mtpspec/kernels/cpu_attention.cc",
            ],
            depends=["mtpspec/kernels/isa.h", "mtpspec/kernels/parallel.h"],
            include_dirs=[jax.ffi.include_dir()],
            extra_compile_args=["-O3", "-std=c++17", "-w"],
            language="c++",
            optional=True,
        )
    ]


setup(ext_modules=_ext_modules(), cmdclass={"build_ext": OptionalBuildExt})
