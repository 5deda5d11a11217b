"""Test-session set-up: a persistent XLA compilation cache shared by the pytest-xdist workers.

Many tests compile the very same generate/forward programs (same config, same shapes); with the
cache, the second worker to need one loads it instead of compiling again. Results are identical
(the cache stores the compiled executable of the same HLO); only wall time changes.
"""

from __future__ import annotations

import os
import pathlib

import jax

_CACHE = pathlib.Path(
    os.environ.get("MTPSPEC_TEST_JAX_CACHE", pathlib.Path(__file__).parent.parent / ".jax_cache")
)
jax.config.update("jax_compilation_cache_dir", str(_CACHE))
jax.config.update("jax_persistent_cache_min_compile_time_secs", 0.5)
jax.config.update("jax_persistent_cache_min_entry_size_bytes", 0)
