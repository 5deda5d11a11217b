"""The few-row CPU linear (``cpu_linear.cc``), loaded with ctypes and registered as an XLA FFI
target.

    ok, why = status()                 # (False, reason) when it was not built or cannot run here
    wp = pack(w)                       # [in, out] -> [ceil(out / 16), in, 16] float32, once
    y = apply(x, wp, out)              # x [rows, in] float32 -> [rows, out] float32

Rows are processed in blocks of 6 (then one block of the 1-5 left over; 60 rows at a time) against
each 16-column tile, so a row's accumulation order depends on the block it falls in, as in any
blocked GEMM, and a window of up to 6 rows reads every weight once. Work above ~32 K multiply-adds
is shared with one helper thread of XLA's intra-op pool (``THREADS``).
"""

from __future__ import annotations

import os

import jax
import jax.numpy as jnp
import numpy as np

from mtpspec.kernels import library

TARGET = "mtpspec_cpu_linear"
TILE = 16
# caller + one pool helper: the 2-core machines this is tuned on (1: the caller alone)
THREADS = int(os.environ.get("MTPSPEC_CPU_LINEAR_THREADS", "2"))
# Software prefetch this many 64-byte weight rows ahead of the FMAs (0 = off): overlaps the
# weight stream with the arithmetic, which a window of 3+ rows needs (BUILD_NOTES 2026-12-02,
# fourth session: in-loop r(4) 1.47 -> 1.10). Read when a call is traced.
PREFETCH = 64


KERNEL = library.Target(TARGET, "MtpspecCpuLinear", "linear='ffi' needs the C++ CPU linear kernel")
available, require = KERNEL.available, KERNEL.require  # both ask KERNEL.status()


def status() -> tuple[bool, str]:
    return KERNEL.status()


def packed_shape(d_in: int, d_out: int) -> tuple[int, int, int]:
    return (-(-d_out // TILE), d_in, TILE)


def pack(w) -> jax.Array:
    """[in, out] -> [tiles, in, 16] float32, output columns zero-padded to a multiple of 16."""
    w = jnp.asarray(w, jnp.float32)
    d_in, d_out = w.shape
    tiles = -(-d_out // TILE)
    w = jnp.pad(w, ((0, 0), (0, tiles * TILE - d_out)))
    return w.reshape(d_in, tiles, TILE).transpose(1, 0, 2)


def unpack(wp: jax.Array, d_out: int) -> jax.Array:
    """Inverse of ``pack`` (inside jit: a transpose)."""
    tiles, d_in, _ = wp.shape
    return wp.transpose(1, 0, 2).reshape(d_in, tiles * TILE)[:, :d_out]


def apply(x: jax.Array, wp: jax.Array, d_out: int) -> jax.Array:
    """x [rows, in] float32 @ the packed weight -> [rows, out] float32 (the FFI call)."""
    require()  # registers the FFI target on first use (cached)
    rows = x.shape[0]
    return jax.ffi.ffi_call(TARGET, jax.ShapeDtypeStruct((rows, d_out), jnp.float32))(
        x.astype(jnp.float32), wp, threads=np.int64(THREADS), prefetch=np.int64(PREFETCH)
    )
