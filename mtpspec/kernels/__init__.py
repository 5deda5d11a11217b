"""Native kernels called from XLA through ``jax.ffi`` (optional: built by the install step into
one library, ``_cpu_kernels*.so``; ``library.status()`` says whether it is available and why).

cpu_linear   y = x W for a few rows on CPU (the decode step and the verify window), weights
             packed once at load
cpu_gdn      the gated delta rule over a short window on CPU (GDN method "ffi")
"""


def trace_settings() -> tuple:
    """The kernels' module-level knobs that a traced call reads (instruction set, threads,
    prefetch distance), as a hashable tuple: decoding puts it in its program key, so a program
    compiled under one setting is never reused after the setting changes."""
    from mtpspec.kernels import cpu_attention, cpu_gdn, cpu_linear

    return (
        ("isa", cpu_linear.ISA),
        ("linear_threads", cpu_linear.THREADS),
        ("prefetch", cpu_linear.PREFETCH),
        ("attention_threads", cpu_attention.THREADS),
        ("gdn_threads", cpu_gdn.THREADS),
    )
