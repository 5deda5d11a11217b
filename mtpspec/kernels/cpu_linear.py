"""The few-row CPU linear (``cpu_linear.cc``), loaded with ctypes and registered as an XLA FFI
target.

    ok, why = status()                 # (False, reason) when it was not built or cannot run here
    wp = pack(w)                       # [in, out] -> [ceil(out / 128), in, 128] float32, once
    wp = pack(w, jnp.bfloat16)         # ... or bfloat16 (half the bytes streamed per call)
    y = apply(x, wp, out)              # x [rows, in] float32 -> [rows, out] float32

A bfloat16 weight is widened exactly in registers and accumulated in float32 in the same order,
so its result equals, bit for bit, the float32 kernel's on the same weights widened
(``pack(w.astype(jnp.float32))``): storing a bf16 checkpoint's weights as bf16 changes no value.
A packed bf16 weight is held as uint16 (the bf16 bit patterns; ``stored_dtype`` says bfloat16):
XLA:CPU computes bf16 gathers and bitcasts by widening their whole operand to float32 first, and
hoists that out of the decode loop — a 1 GB temporary for a tied Qwen3.5 embedding gathered
from its LM head (``packed_columns``, ``widen``).

The packed layout keeps 128 output columns (8 tiles of 16) per row of a group, so a decode step
reads each group as one contiguous stream. Rows are processed in blocks of 6 (then one block of
the 1-5 left over; 252 rows at a time; a window of up to 6 rows in blocks of 3 on AVX-512)
against up to 8 tiles side by side, and a window of up to 6 rows reads every weight once.
Every output is one float32 FMA chain over its inputs in order, whatever block its row falls
in, with AVX2 or, where the CPU has it, AVX-512
(``settings.current().isa``): a row's value is the same alone, in a verify window or in a
prefill, on either instruction set. Work above ~32 K multiply-adds is shared with helper threads
of XLA's intra-op pool (``linear_threads``), and the weight stream is prefetched ``prefetch``
group rows (128 weights each) ahead of the FMAs (BUILD_NOTES.md has the runs). All three are read
when a call is traced (``kernels.settings``).
"""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp

from mtpspec.kernels import library, settings

TARGET = "mtpspec_cpu_linear"
TARGET_BF16 = "mtpspec_cpu_linear_bf16"
PACK_DTYPES = (jnp.float32, jnp.bfloat16)
GROUP = 128  # columns per packed row: 8 tiles of 16 side by side, read as one stream
ISAS = settings.ISAS


KERNEL = library.Target(TARGET, "MtpspecCpuLinear", "linear='ffi' needs the C++ CPU linear kernel")
available, require = KERNEL.available, KERNEL.require  # both ask KERNEL.status()
KERNEL_BF16 = library.Target(
    TARGET_BF16, "MtpspecCpuLinearBf16", "bfloat16 weights with linear='ffi' need the C++ kernel"
)


def status() -> tuple[bool, str]:
    return KERNEL.status()


has_avx512 = settings.has_avx512


def isa_name(isa: str | None = None) -> str:
    """What ``isa`` (default: the settings in effect) runs here: "avx512" or "avx2"."""
    return ("avx2", "avx512")[isa_code(isa)]


def isa_code(isa: str | None = None) -> int:
    """The kernels' ``isa`` attribute for ``isa`` (default: ``settings.current()``'s): 0 AVX2,
    1 AVX-512. An unknown name raises ValueError, "avx512" without AVX-512F OSError."""
    if isa is None:
        return settings.current().isa_code
    return settings.KernelSettings(isa=isa).isa_code


def packed_shape(d_in: int, d_out: int) -> tuple[int, int, int]:
    return (-(-d_out // GROUP), d_in, GROUP)


def _check_pack_dtype(dtype) -> jnp.dtype:
    if jnp.dtype(dtype) not in [jnp.dtype(d) for d in PACK_DTYPES]:
        raise ValueError(f"the CPU linear packs float32 or bfloat16 weights, not {dtype}")
    return jnp.dtype(dtype)


@functools.partial(jax.jit, static_argnames=("dtype", "rows"))
def _pack(w, dtype, rows: bool):
    # one compiled copy (eager pad / reshape / transpose would each materialise the matrix)
    w = w.astype(dtype)
    if dtype == jnp.bfloat16:
        w = jax.lax.bitcast_convert_type(w, jnp.uint16)
    if rows:  # [out, in]
        d_out, d_in = w.shape
        groups = -(-d_out // GROUP)
        w = jnp.pad(w, ((0, groups * GROUP - d_out), (0, 0)))
        return w.reshape(groups, GROUP, d_in).transpose(0, 2, 1)
    d_in, d_out = w.shape
    groups = -(-d_out // GROUP)
    w = jnp.pad(w, ((0, 0), (0, groups * GROUP - d_out)))
    return w.reshape(d_in, groups, GROUP).transpose(1, 0, 2)


def stored_dtype(wp: jax.Array) -> jnp.dtype:
    """What a packed weight stores: bfloat16 (held as uint16 bit patterns) or float32."""
    return jnp.dtype(jnp.bfloat16) if wp.dtype == jnp.uint16 else jnp.dtype(wp.dtype)


def as_stored(raw: jax.Array) -> jax.Array:
    """Values read from a packed weight in its ``stored_dtype`` (uint16 bits as bfloat16)."""
    if raw.dtype == jnp.uint16:
        return jax.lax.bitcast_convert_type(raw, jnp.bfloat16)
    return raw


def widen(raw: jax.Array) -> jax.Array:
    """Values read from a packed weight as float32, exactly (bf16 bits shifted into the top
    half of a float32: integer ops, which XLA applies to the gathered values only)."""
    if raw.dtype == jnp.uint16:
        return jax.lax.bitcast_convert_type(raw.astype(jnp.uint32) << 16, jnp.float32)
    return raw.astype(jnp.float32)


def pack(w, dtype=jnp.float32) -> jax.Array:
    """[in, out] -> [groups, in, 128] in ``dtype`` (float32 or bfloat16), output columns
    zero-padded to a multiple of 128."""
    return _pack(jnp.asarray(w), _check_pack_dtype(dtype), False)


def pack_rows(w_t, dtype=jnp.float32) -> jax.Array:
    """``pack(w_t.T, dtype)`` from an [out, in] matrix (a tied embedding as the LM head), without
    a transposed copy first."""
    return _pack(jnp.asarray(w_t), _check_pack_dtype(dtype), True)


def packed_columns(wp: jax.Array, ids) -> jax.Array:
    """Output columns ``ids`` (any int shape) of a packed weight: ids.shape + [in], raw (uint16
    for bf16: ``as_stored`` / ``widen`` read them) — w[:, id] of the unpacked [in, out] matrix, a
    strided gather of ``in`` values each (a tied embedding's rows, read from the LM head it is
    packed as)."""
    ids = jnp.asarray(ids, jnp.int32)
    return wp[ids // GROUP, :, ids % GROUP]


def unpack(wp: jax.Array, d_out: int) -> jax.Array:
    """Inverse of ``pack``, in the stored dtype (inside jit: a transpose)."""
    groups, d_in, _ = wp.shape
    return as_stored(wp.transpose(1, 0, 2).reshape(d_in, groups * GROUP)[:, :d_out])


def apply(x: jax.Array, wp: jax.Array, d_out: int) -> jax.Array:
    """x [rows, in] float32 @ the packed weight -> [rows, out] float32 (the FFI call). x may also
    come as [rows, h, d] with h · d = in (heads not flattened first: see ``Linear.__call__``)."""
    bf16 = wp.dtype == jnp.uint16
    (KERNEL_BF16 if bf16 else KERNEL).require()  # registers the FFI target on first use (cached)
    rows = x.shape[0]
    target = TARGET_BF16 if bf16 else TARGET
    return jax.ffi.ffi_call(target, jax.ShapeDtypeStruct((rows, d_out), jnp.float32))(
        x.astype(jnp.float32), wp, **settings.current().attributes("linear")
    )
