"""The native kernel library (``_cpu_kernels*.so``: cpu_linear.cc, cpu_gdn.cc, cpu_attention.cc),
loaded once.

ok, why = status()     # (False, reason) when it was not built or cannot run on this CPU
lib = handle()         # the ctypes handle (only when status() is ok)
warn_if_missing()      # once per process: a warning when they are missing (decoding's "auto")

``python -m mtpspec.kernels`` prints the status.
"""

from __future__ import annotations

import ctypes
import functools
import pathlib
import threading
import warnings

_HERE = pathlib.Path(__file__).parent
PATTERN = "_cpu_kernels*.so"
# The interface version these Python wrappers expect (``mtpspec_cpu_kernels_abi()`` in
# cpu_linear.cc; bumped whenever a target's arguments or attributes change).
ABI = 11


@functools.cache
def _load() -> tuple[ctypes.CDLL | None, str]:
    libs = sorted(_HERE.glob(PATTERN))
    if not libs:
        return None, (
            f"the C++ kernels are not built (no {PATTERN} in {_HERE}); reinstall "
            "(`pip install .` or `make install`) on a machine with a C++ compiler"
        )
    try:
        lib = ctypes.CDLL(str(libs[-1]))
    except OSError as e:
        return None, f"the C++ kernel library {libs[-1].name} cannot be loaded: {e}"
    abi = getattr(lib, "mtpspec_cpu_kernels_abi", None)
    if abi is None or abi() != ABI:
        return None, (
            f"the C++ kernel library {libs[-1].name} was built from other sources (interface "
            f"{None if abi is None else abi()}, expected {ABI}); rerun `make install`"
        )
    if not lib.mtpspec_cpu_linear_supported():
        return None, "this CPU lacks AVX2/FMA, which the C++ kernels need"
    return lib, f"built ({libs[-1].name})"


def status() -> tuple[bool, str]:
    """(available, reason): the library is built and this CPU has AVX2 + FMA."""
    lib, why = _load()
    return lib is not None, why


# The cost of running without them, as measured on the shipped model (BUILD_NOTES.md).
MISSING_COST = "plain decoding on CPU ran 1.5-1.9x slower on XLA's path"
_warned: set[str] = set()
_warn_lock = threading.Lock()


def warn_if_missing() -> bool:
    """When the library is unavailable, warn once per process (a ``RuntimeWarning`` naming the
    kernels, why they are missing and what that costs); True when it warned now. Decoding's
    "auto" choices call it on CPU, so an install without the kernels says so at first use."""
    ok, why = status()
    with _warn_lock:
        if ok or why in _warned:
            return False
        _warned.add(why)
    warnings.warn(
        f"mtpspec: the C++ CPU kernels (linear, GDN window, attention) are unavailable: {why}. "
        f"Decoding runs XLA's forms instead: {MISSING_COST}. `python -m mtpspec.kernels` "
        "prints the status.",
        RuntimeWarning,
        stacklevel=2,
    )
    return True


def handle() -> ctypes.CDLL:
    lib, why = _load()
    if lib is None:
        raise OSError(why)
    return lib


class Target:
    """One FFI handler of the library: registered with XLA's CPU platform the first time its
    status is asked for and the library is available. ``status()`` is (available, reason): the
    library is built, the CPU has AVX2 + FMA, and the target is registered; ``available()`` and
    ``require()`` ask it (patch ``status`` on the instance to simulate a missing kernel)."""

    def __init__(self, name: str, symbol: str, needed_by: str):
        self.name, self.symbol, self.needed_by = name, symbol, needed_by
        self._status: tuple[bool, str] | None = None
        self._lock = threading.Lock()  # two threads must not register the target twice

    def status(self) -> tuple[bool, str]:
        with self._lock:
            return self._status_locked()

    def _status_locked(self) -> tuple[bool, str]:
        if self._status is None:
            ok, why = status()
            if ok:
                import jax

                symbol = getattr(handle(), self.symbol, None)
                if symbol is None:  # a library built from older sources
                    ok, why = False, f"the built library lacks {self.symbol}; rerun `make install`"
                else:
                    capsule = jax.ffi.pycapsule(symbol)
                    jax.ffi.register_ffi_target(self.name, capsule, platform="cpu")
            self._status = (ok, why)
        return self._status

    def available(self) -> bool:
        return self.status()[0]

    def require(self) -> None:
        """Raise OSError saying why the kernel cannot be used."""
        ok, why = self.status()
        if not ok:
            raise OSError(f"{self.needed_by}, but {why}")
