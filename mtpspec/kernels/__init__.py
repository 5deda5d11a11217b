"""Native kernels called from XLA through ``jax.ffi`` (optional: built by the install step into
one library, ``_cpu_kernels*.so``; ``library.status()`` says whether it is available and why).

cpu_linear     y = x W for a few rows on CPU (the decode step and the verify window), weights
               packed once at load
cpu_gdn        the gated delta rule over a short window on CPU (GDN method "ffi"), its tree form
               and the native "replay" commit
cpu_attention  causal attention of a decode window over its KV cache, and its tree form
settings       how they run (instruction set, threads, prefetch): ``KernelSettings``, ``use``
"""
