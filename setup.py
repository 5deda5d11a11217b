"""Build step for the optional C++ kernel (everything else is in setup.cfg).

``mtpspec/kernels/cpu_linear.cc`` (a few-row CPU linear called from XLA through ``jax.ffi``) is
compiled against the XLA FFI headers that jaxlib ships (``jax.ffi.include_dir()``), so jax must be
importable when this runs: ``make install`` installs it first and builds with
``--no-build-isolation``. The kernel is optional: without jax at build time, without a C++
compiler, or if compiling fails, the install still succeeds without it; at run time
``mtpspec.kernels.cpu_linear.status()`` says why it is missing and ``linear="auto"`` uses XLA's
dots instead.
"""

from __future__ import annotations

import sys

from setuptools import Extension, setup
from setuptools.command.build_ext import build_ext


class OptionalBuildExt(build_ext):
    """Build the kernel if possible; never fail the install because of it."""

    def run(self):
        try:
            super().run()
        except Exception as e:  # noqa: BLE001 - any failure leaves the kernel out, loudly
            self._skip(e)

    def build_extension(self, ext):
        try:
            super().build_extension(ext)
        except Exception as e:  # noqa: BLE001
            self._skip(e)

    @staticmethod
    def _skip(error):
        print(
            f"mtpspec: the C++ CPU linear kernel was not built ({error}); "
            "mtpspec runs without it (linear='xla')",
            file=sys.stderr,
        )


def _ext_modules():
    try:
        import jax.ffi
    except Exception as e:  # noqa: BLE001
        OptionalBuildExt._skip(f"jax is not importable at build time: {e}")
        return []
    return [
        Extension(
            "mtpspec.kernels._cpu_linear",
            sources=["mtpspec/kernels/cpu_linear.cc"],
            include_dirs=[jax.ffi.include_dir()],
            extra_compile_args=["-O3", "-std=c++17", "-w"],
            language="c++",
            optional=True,
        )
    ]


setup(ext_modules=_ext_modules(), cmdclass={"build_ext": OptionalBuildExt})
