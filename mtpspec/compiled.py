"""mtpspec's own compiled functions and memos, registered so that releasing them releases only
mtpspec's — never the jitted functions, caches or config of the user's process.

    step = compiled.jit(step_impl, static_argnames=("config",))   # instead of jax.jit
    compiled.register(CACHE)                                      # anything with .clear()
    compiled.release()                                            # drop them all, then collect

``release`` clears each registered cache, then each registered jitted function's own cache
(``jax.jit(...).clear_cache()``: its executables and its traces), then collects, so the
executables' code and data are unmapped. A jitted function of the user's keeps its compiled
executables: its next call with the same argument types neither traces nor compiles.
``jax.clear_caches()`` would empty every jit cache in the process and is never called here.
"""

from __future__ import annotations

import ctypes
import gc
import threading
from typing import Any

import jax

_LOCK = threading.RLock()
_FUNCTIONS: list = []  # mtpspec's module-level jitted functions
_CACHES: list = []  # mtpspec's own caches of compiled programs or derived weights


def jit(fun, **options):
    """``jax.jit(fun, **options)``, registered for ``release``."""
    jitted = jax.jit(fun, **options)
    with _LOCK:
        _FUNCTIONS.append(jitted)
    return jitted


def register(cache: Any) -> Any:
    """Register a cache of compiled programs: an object with ``clear()``, or a
    ``functools.lru_cache`` (``cache_clear()``) of functions that hold jitted ones."""
    with _LOCK:
        _CACHES.append(cache)
    return cache


def release() -> None:
    """Clear every registered cache and jitted function, then collect."""
    with _LOCK:  # the lists only: each cache takes its own lock while it clears
        caches, functions = list(_CACHES), list(_FUNCTIONS)
    for cache in caches:
        (cache.cache_clear if hasattr(cache, "cache_clear") else cache.clear)()
    for fun in functions:
        fun.clear_cache()
    gc.collect()


def return_freed_memory() -> None:
    """Hand the heap pages already freed back to the OS (glibc's ``malloc_trim``; a no-op
    elsewhere). Only frees what is free: a loader's freed canonical arrays (~0.15 GB at
    Qwen3.5-0.8B's size), a compile's freed working memory (~0.1-0.2 GB per real-size program),
    which glibc otherwise keeps in the resident set."""
    try:
        trim = ctypes.CDLL(None).malloc_trim
    except (OSError, AttributeError):
        return
    trim.argtypes, trim.restype = [ctypes.c_size_t], ctypes.c_int
    trim(0)
