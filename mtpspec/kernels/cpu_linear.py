"""The few-row CPU linear (``cpu_linear.cc``), loaded with ctypes and registered as an XLA FFI
target.

    ok, why = status()                 # (False, reason) when it was not built or cannot run here
    wp = pack(w)                       # [in, out] -> [ceil(out / 128), in, 128] float32, once
    wp = pack(w, jnp.bfloat16)         # ... or bfloat16 (half the bytes streamed per call)
    wp = pack(w, jnp.int8)             # ... or per-column int8 + float32 scales (opt-in, lossy)
    y = apply(x, wp, out)              # x [rows, in] float32 -> [rows, out] float32

A bfloat16 weight is widened exactly in registers and accumulated in float32 in the same order,
so its result equals, bit for bit, the float32 kernel's on the same weights widened
(``pack(w.astype(jnp.float32))``): storing a bf16 checkpoint's weights as bf16 changes no value.
A packed bf16 weight is held as uint16 (the bf16 bit patterns; ``stored_dtype`` says bfloat16):
XLA:CPU computes bf16 gathers and bitcasts by widening their whole operand to float32 first, and
hoists that out of the decode loop — a 1 GB temporary for a tied Qwen3.5 embedding gathered
from its LM head (``packed_columns``, ``widen``).

An int8 weight (``quantize``: symmetric per output column) is packed as [groups, in + 4, 128]:
each column's float32 scale as 4 bytes down the column after its ``in`` rows. The kernel widens
the int8 values exactly and runs the float32 chain, then multiplies each column by its scale: the
float32 kernel's result on the int8 values, times the scales, bit for bit (bf16 activations do not
apply to it).

The packed layout keeps 128 output columns (8 tiles of 16; 64, 4 tiles, when packed under AVX2:
``group_width``) per row of a group, so a decode step reads each group as one contiguous
stream. Rows are processed in blocks of 6 (then one block of the 1-5 left over; 252 rows at a
time; a window of up to 6 rows in blocks of 3 on AVX-512) against up to 8 tiles side by side,
and a window of up to 6 rows reads every weight once.
Every output is one float32 FMA chain over its inputs in order, whatever block its row falls in,
with AVX2 or, where the CPU has it, AVX-512 (``settings.current().isa``): a row's value is the same
alone, in a verify window or in a prefill, on either instruction set. (Opt-in exception: with
``KernelSettings.prefill_activations="bfloat16"`` the prompt's forward rounds the activations of its
bf16-weight calls to bf16 and sums pairs of products with AVX-512 BF16's ``vdpbf16ps``, the ``dot``
attribute: about twice as fast, not the decode step's values.) Work above ~32 K multiply-adds is
shared with helper threads of XLA's intra-op pool (``linear_threads``), and the weight stream is
prefetched ``prefetch`` group rows (128 weights each) ahead of the FMAs (BUILD_NOTES.md has the
runs). All three are read when a call is traced (``kernels.settings``).
"""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
import numpy as np

from mtpspec.kernels import library, settings

TARGET = "mtpspec_cpu_linear"
TARGET_BF16 = "mtpspec_cpu_linear_bf16"
TARGET_S8 = "mtpspec_cpu_linear_s8"
TARGET_ARGMAX = "mtpspec_cpu_head_argmax"
TARGET_ARGMAX_BF16 = "mtpspec_cpu_head_argmax_bf16"
TARGET_SCREEN = "mtpspec_cpu_screen"
TARGET_SCREEN_BF16 = "mtpspec_cpu_screen_bf16"
PACK_DTYPES = (jnp.float32, jnp.bfloat16, jnp.int8)
# int8 storage: each group's per-column float32 scales follow its input rows, as bytes (4 rows).
SCALE_ROWS = 4
# The packed row widths the kernel reads, by ISA code: 64 columns (4 tiles of 16 side by side,
# AVX2's most) or 128 (8, AVX-512's), each row read as one stream.
GROUPS = (64, 128)


def group_width(isa: str | None = None) -> int:
    """The packed row width for ``isa`` (default: the settings in effect): 128 columns where
    AVX-512 runs (8 tiles a pass), 64 on AVX2 (its 16 registers hold 4 tiles of a row, so a
    128-column row took two passes, the second from L2: a decode step's products ~1.1x and a
    4-row window's ~1.4x slower, BUILD_NOTES 2026-12-07). The kernel reads either width with
    either instruction set and the values do not depend on it; only the speed does."""
    return GROUPS[isa_code(isa)]


ISAS = settings.ISAS


KERNEL = library.Target(TARGET, "MtpspecCpuLinear", "linear='ffi' needs the C++ CPU linear kernel")
available, require = KERNEL.available, KERNEL.require  # both ask KERNEL.status()
KERNEL_BF16 = library.Target(
    TARGET_BF16, "MtpspecCpuLinearBf16", "bfloat16 weights with linear='ffi' need the C++ kernel"
)
KERNEL_S8 = library.Target(
    TARGET_S8, "MtpspecCpuLinearS8", "int8 weights (weights='int8') need the C++ CPU linear kernel"
)

_SCREENED = "a screened greedy head needs the C++ CPU linear kernel"
KERNEL_ARGMAX = library.Target(TARGET_ARGMAX, "MtpspecCpuHeadArgmax", _SCREENED)
KERNEL_ARGMAX_BF16 = library.Target(TARGET_ARGMAX_BF16, "MtpspecCpuHeadArgmaxBf16", _SCREENED)
KERNEL_SCREEN = library.Target(TARGET_SCREEN, "MtpspecCpuScreen", _SCREENED)
KERNEL_SCREEN_BF16 = library.Target(TARGET_SCREEN_BF16, "MtpspecCpuScreenBf16", _SCREENED)

# Each call's FFI target by the packed weight's dtype (bf16 held as uint16).
_F32, _BF16, _S8 = jnp.dtype(jnp.float32), jnp.dtype(jnp.uint16), jnp.dtype(jnp.int8)
LINEAR_KERNELS = {_F32: KERNEL, _BF16: KERNEL_BF16, _S8: KERNEL_S8}
ARGMAX_KERNELS = {_F32: KERNEL_ARGMAX, _BF16: KERNEL_ARGMAX_BF16}
SCREEN_KERNELS = {_F32: KERNEL_SCREEN, _BF16: KERNEL_SCREEN_BF16}


def _target(kernels: dict, wp: jax.Array) -> str:
    """The name of the FFI target in ``kernels`` for ``wp``'s dtype (another dtype: the float32
    target's, which then refuses it), registered on first use (OSError when the library cannot
    serve it)."""
    kernel = kernels.get(jnp.dtype(wp.dtype), kernels[_F32])
    kernel.require()
    return kernel.name


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


def packed_shape(d_in: int, d_out: int, group: int | None = None) -> tuple[int, int, int]:
    """A float32 or bf16 packed weight's shape (an int8 one has ``SCALE_ROWS`` more rows)."""
    group = _check_group(group)
    return (-(-d_out // group), d_in, group)


def _check_group(group: int | None) -> int:
    if group is None:
        return group_width()
    if group not in GROUPS:
        raise ValueError(f"a packed row is {GROUPS[0]} or {GROUPS[1]} columns wide, not {group}")
    return group


def _check_pack_dtype(dtype) -> jnp.dtype:
    if jnp.dtype(dtype) not in [jnp.dtype(d) for d in PACK_DTYPES]:
        raise ValueError(f"the CPU linear packs float32, bfloat16 or int8 weights, not {dtype}")
    return jnp.dtype(dtype)


@functools.partial(jax.jit, static_argnames=("dtype", "rows", "group"))
def _pack(w, dtype, rows: bool, group: int):
    # one compiled copy (eager pad / reshape / transpose would each materialise the matrix)
    if dtype == jnp.int8:
        return _pack_int8(w, rows, group)
    w = w.astype(dtype)
    if dtype == jnp.bfloat16:
        w = jax.lax.bitcast_convert_type(w, jnp.uint16)
    return _grouped(w, rows, group)


def _grouped(w, rows: bool, group: int):
    """[in, out] (or ``rows``: [out, in]) -> [groups, in, group], the output columns zero-padded
    to a multiple of ``group``; values as they are (any dtype)."""
    if rows:  # [out, in]
        d_out, d_in = w.shape
        groups = -(-d_out // group)
        w = jnp.pad(w, ((0, groups * group - d_out), (0, 0)))
        return w.reshape(groups, group, d_in).transpose(0, 2, 1)
    d_in, d_out = w.shape
    groups = -(-d_out // group)
    w = jnp.pad(w, ((0, 0), (0, groups * group - d_out)))
    return w.reshape(d_in, groups, group).transpose(1, 0, 2)


def quantize(w, axis: int):
    """Symmetric per-column int8 quantisation of w (float32 math) over ``axis`` (the inputs):
    (q, scale) with w ≈ q · scale, scale = max |w| / 127 over the column (1 for an all-zero
    column), q = round-half-even(w / scale) in [-127, 127]."""
    w = w.astype(jnp.float32)
    amax = jnp.max(jnp.abs(w), axis=axis, keepdims=True, initial=0.0)  # no inputs: 0
    scale = jnp.where(amax > 0, amax / 127.0, 1.0)
    q = jnp.clip(jnp.round(w / scale), -127, 127).astype(jnp.int8)
    return q, jnp.squeeze(scale, axis)


def _pack_int8(w, rows: bool, group: int):
    q, scale = quantize(w, 1 if rows else 0)
    q = _grouped(q, rows, group)
    groups, d_out = q.shape[0], scale.shape[0]
    scale = jnp.pad(scale, (0, groups * group - d_out), constant_values=1.0)
    raw = jax.lax.bitcast_convert_type(scale, jnp.int8)  # [groups * group, 4], little-endian
    # row in + b of a group: byte b of each column's scale (a column carries its own scale)
    raw = raw.reshape(groups, group, SCALE_ROWS).transpose(0, 2, 1)
    return jnp.concatenate([q, raw], axis=1)


def scales(wp: jax.Array) -> jax.Array:
    """An int8 packed weight's per-column scales, [groups · group] float32 (padding: 1)."""
    groups, _, group = wp.shape
    raw = wp[:, -SCALE_ROWS:, :].transpose(0, 2, 1).reshape(groups * group, SCALE_ROWS)
    return jax.lax.bitcast_convert_type(raw, jnp.float32)


def _dequantize(raw: jax.Array) -> jax.Array:
    """Columns read from an int8 packed weight (``packed_columns``: [..., in + 4]) as float32
    values q · scale."""
    q = raw[..., :-SCALE_ROWS].astype(jnp.float32)
    return q * jax.lax.bitcast_convert_type(raw[..., -SCALE_ROWS:], jnp.float32)[..., None]


def stored_dtype(wp: jax.Array) -> jnp.dtype:
    """What a packed weight stores: bfloat16 (held as uint16 bit patterns), int8 (with
    per-column scales) or float32."""
    return jnp.dtype(jnp.bfloat16) if wp.dtype == jnp.uint16 else jnp.dtype(wp.dtype)


def as_stored(raw: jax.Array) -> jax.Array:
    """Values read from a packed weight in its ``stored_dtype`` (uint16 bits as bfloat16; int8
    columns with their scales as float32 q · scale)."""
    if raw.dtype == jnp.int8:
        return _dequantize(raw)
    if raw.dtype == jnp.uint16:
        return jax.lax.bitcast_convert_type(raw, jnp.bfloat16)
    return raw


def widen(raw: jax.Array) -> jax.Array:
    """Values read from a packed weight as float32, exactly (bf16 bits shifted into the top
    half of a float32: integer ops, which XLA applies to the gathered values only; int8: q ·
    scale)."""
    if raw.dtype == jnp.int8:
        return _dequantize(raw)
    if raw.dtype == jnp.uint16:
        return jax.lax.bitcast_convert_type(raw.astype(jnp.uint32) << 16, jnp.float32)
    return raw.astype(jnp.float32)


def pack(w, dtype=jnp.float32, group: int | None = None) -> jax.Array:
    """[in, out] -> [groups, in, group] in ``dtype`` (float32 or bfloat16), output columns
    zero-padded to a multiple of ``group`` (64 or 128; default ``group_width()``)."""
    return _pack(jnp.asarray(w), _check_pack_dtype(dtype), False, _check_group(group))


def pack_rows(w_t, dtype=jnp.float32, group: int | None = None) -> jax.Array:
    """``pack(w_t.T, dtype, group)`` from an [out, in] matrix (a tied embedding as the LM head),
    without a transposed copy first."""
    return _pack(jnp.asarray(w_t), _check_pack_dtype(dtype), True, _check_group(group))


def packed_columns(wp: jax.Array, ids) -> jax.Array:
    """Output columns ``ids`` (any int shape) of a packed weight: ids.shape + [in], raw (uint16
    for bf16: ``as_stored`` / ``widen`` read them) — w[:, id] of the unpacked [in, out] matrix, a
    strided gather of ``in`` values each (a tied embedding's rows, read from the LM head it is
    packed as)."""
    ids = jnp.asarray(ids, jnp.int32)
    group = wp.shape[2]
    return wp[ids // group, :, ids % group]


@functools.partial(jax.jit, static_argnames=("group",))
def pack_raw_rows(raw: jax.Array, group: int) -> jax.Array:
    """Columns read from a packed weight (``packed_columns``: [N, in], or [N, in + 4] int8 with
    their scales) packed again as an [groups, in (+ 4), group] weight of those N columns, the
    stored values unchanged (padding columns: zeros, never output)."""
    return _grouped(raw, True, group)


def unpack(wp: jax.Array, d_out: int) -> jax.Array:
    """Inverse of ``pack``, in the stored dtype (inside jit: a transpose; int8: the float32
    values q · scale)."""
    groups, rows, group = wp.shape  # rows: the inputs (int8: and its scale rows)
    columns = wp.transpose(0, 2, 1).reshape(groups * group, rows)[:d_out]  # as packed_columns
    return as_stored(columns).T


def apply(x: jax.Array, wp: jax.Array, d_out: int) -> jax.Array:
    """x [rows, in] float32 @ the packed weight -> [rows, out] float32 (the FFI call). x may also
    come as [rows, h, d] with h · d = in (heads not flattened first: see ``Linear.__call__``)."""
    bf16 = wp.dtype == jnp.uint16
    target = _target(LINEAR_KERNELS, wp)
    rows = x.shape[0]
    attrs = settings.current().attributes("linear")
    if not bf16:  # bfloat16 activations are for bfloat16 weights (KernelSettings)
        attrs["dot"] = np.int64(0)
    return jax.ffi.ffi_call(target, jax.ShapeDtypeStruct((rows, d_out), jnp.float32))(
        x.astype(jnp.float32), wp, **attrs
    )


def screen(wp: jax.Array) -> jax.Array:
    """The int8 screen of a float32 or bf16 packed weight, in the int8 packed layout [groups,
    in + 4, group]: per column, scale = max |w| · fl(1 / 127) (at least the smallest normal
    float; 0 for an all-zero column, whose value is exactly 0) and q =
    round-half-even(w / scale) in [-127, 127], in IEEE float32 (``quantize``'s XLA arithmetic may
    round a few values otherwise; ``head_argmax``'s bound holds for either), made by the C++
    library from the packed weight in place (an XLA form held a float32 copy of the head: ~1 GB
    at Qwen3.5's size)."""
    if wp.dtype not in (jnp.float32, jnp.uint16):
        raise ValueError(f"a screen is made from a float32 or bf16 packed weight, not {wp.dtype}")
    return _screen(wp)


@jax.jit
def _screen(wp):
    target = _target(SCREEN_KERNELS, wp)
    groups, d_in, group = wp.shape
    out = jax.ShapeDtypeStruct((groups, d_in + SCALE_ROWS, group), jnp.int8)
    threads = settings.current().attributes("linear")["threads"]
    return jax.ffi.ffi_call(target, out)(wp, threads=threads)


def head_argmax(x: jax.Array, wp: jax.Array, sp: jax.Array, d_out: int):
    """Greedy argmax of x [rows, in] @ the packed float32 / bf16 weight ``wp`` over its ``d_out``
    columns, through its int8 screen ``sp`` (``screen(wp)``): (ids [rows] int32, top [rows]
    float32, exact [rows] int32) — ``ops.argmax(apply(x, wp, d_out))`` and its value, bit for
    bit, streaming the screen and then only the packed groups the screen's error bound cannot
    rule out (``exact``: the columns computed from ``wp``; cpu_linear.cc has the bound)."""
    if wp.dtype not in (jnp.float32, jnp.uint16) or sp.dtype != jnp.int8:
        raise ValueError(
            f"head_argmax takes a float32 or bf16 packed weight and its int8 screen, got "
            f"{wp.dtype} and {sp.dtype}"
        )
    if sp.shape != (wp.shape[0], wp.shape[1] + SCALE_ROWS, wp.shape[2]):
        raise ValueError(f"a screen of shape {sp.shape} does not belong to a weight {wp.shape}")
    target = _target(ARGMAX_KERNELS, wp)
    rows = x.shape[0]
    attrs = settings.current().attributes("linear")
    del attrs["dot"]
    out = (
        jax.ShapeDtypeStruct((rows,), jnp.int32),
        jax.ShapeDtypeStruct((rows,), jnp.float32),
        jax.ShapeDtypeStruct((rows,), jnp.int32),
    )
    return jax.ffi.ffi_call(target, out)(
        x.reshape(rows, -1).astype(jnp.float32), wp, sp, n=np.int64(d_out), **attrs
    )
