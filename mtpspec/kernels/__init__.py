"""Native kernels called from XLA through ``jax.ffi`` (optional: built by the install step).

cpu_linear   y = x W for a few rows on CPU (the decode step and the verify window), weights
             packed once at load; ``cpu_linear.status()`` says whether it is available and why
"""
