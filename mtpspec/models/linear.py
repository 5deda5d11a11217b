"""The decoding tree's matrices and embedding: ``Linear`` (an inference weight, applied by XLA's dot
or the C++ CPU linear on its packed form) and ``Embedding`` (the token table, or a tied model's
packed LM head read as one). ``models/inference.py`` builds both."""

from __future__ import annotations

import math

import jax
import jax.numpy as jnp
from jax.lax import Precision

from mtpspec.kernels import cpu_linear

HIGHEST = Precision.HIGHEST


def _store(w, impl: str, quant: str | None):
    """The packed dtype of a matrix: int8 where asked, else bf16 stays bf16 (widened exactly in
    registers), anything else float32."""
    if quant not in (None, "int8"):
        raise ValueError(f"quant must be None or 'int8', got {quant!r}")
    if quant == "int8":
        if impl != "ffi":
            raise ValueError("int8 weights need the C++ CPU linear (impl 'ffi')")
        return jnp.int8
    return jnp.bfloat16 if w.dtype == jnp.bfloat16 else jnp.float32


@jax.tree_util.register_pytree_node_class
class Linear:
    """y = x @ W for an inference weight: ``w`` is [in, out] ("xla") or packed [groups, in, 128]
    ("ffi"); ``splits`` are the output widths of the projections fused in it."""

    def __init__(
        self,
        w,
        d_in: int,
        splits: tuple[int, ...],
        impl: str,
        transposed: bool = False,
        screen=None,
    ):
        self.w, self.d_in, self.splits, self.impl = w, d_in, tuple(splits), impl
        self.transposed = transposed  # "xla" only: w is [out, in] (a tied embedding as head)
        # "ffi" float32 / bf16 only: the weight's int8 copy for a screened argmax (``argmax``)
        self.screen = screen

    @property
    def d_out(self) -> int:
        return sum(self.splits)

    def tree_flatten(self):
        return (self.w, self.screen), (self.d_in, self.splits, self.impl, self.transposed)

    @classmethod
    def tree_unflatten(cls, aux, children):
        return cls(children[0], *aux, screen=children[1])

    def __repr__(self):
        t = ", transposed" if self.transposed else ""
        t += ", screened" if self.screen is not None else ""
        return f"Linear({self.d_in}->{self.splits}, impl={self.impl!r}{t})"

    def with_screen(self) -> Linear:
        """The same weight (shared, not copied) with its int8 screen (``cpu_linear.screen``) for
        ``argmax``: a large vocabulary's LM head. "ffi" float32 or bf16 weights only
        (ValueError otherwise)."""
        if self.impl != "ffi" or self.w.dtype not in (jnp.float32, jnp.uint16):
            raise ValueError(
                "a screened head needs a float32 or bf16 weight packed for the C++ linear "
                f"(impl 'ffi'), not impl {self.impl!r} with {self.w.dtype} storage"
            )
        return Linear(self.w, self.d_in, self.splits, self.impl, screen=cpu_linear.screen(self.w))

    def without_screen(self) -> Linear:
        """The same weight (shared) without a screen."""
        return Linear(self.w, self.d_in, self.splits, self.impl, self.transposed)

    def argmax(self, x: jax.Array) -> jax.Array:
        """ids [...] int32 = ``ops.argmax(self(x))`` bit for bit (the first of the largest
        column), through the int8 screen: its stream, then only the packed groups the screen's
        error bound cannot rule out (``cpu_linear.head_argmax``). Needs ``with_screen``."""
        if self.screen is None:
            raise ValueError("this Linear has no screen (Linear.with_screen makes one)")
        lead = x.shape[:-1]
        ids, _, _ = cpu_linear.head_argmax(
            x.reshape(-1, self.d_in), self.w, self.screen, self.d_out
        )
        return ids.reshape(lead)

    def __call__(self, x: jax.Array, heads: bool = False) -> jax.Array:
        """x [..., in] -> [..., out] float32. ``heads``: x is [..., h, d] with h · d = in (the
        kernel takes it as is: XLA:CPU fuses a reshape to [rows, in] into the producing fusion
        and then indexes its per-head operands through divisions, which it does not vectorise —
        the GDN output's gated norm ran scalar, ~10 µs per layer of a verify window)."""
        if heads:
            lead, inner = x.shape[:-2], x.shape[-2:]
            if math.prod(inner) != self.d_in:
                raise ValueError(f"heads {inner} do not make the input width {self.d_in}")
        else:
            lead, inner = x.shape[:-1], x.shape[-1:]
        rows = math.prod(lead)
        if self.impl == "ffi":
            y = cpu_linear.apply(x.reshape(rows, *inner), self.w, self.d_out)
            return y.reshape(*lead, self.d_out)
        x = x.reshape(*lead, self.d_in)
        w = self.w.astype(x.dtype)
        if self.transposed:
            dims = (((x.ndim - 1,), (1,)), ((), ()))
            return jax.lax.dot_general(
                x, w, dims, precision=HIGHEST, preferred_element_type=jnp.float32
            )
        return jnp.matmul(x, w, precision=HIGHEST, preferred_element_type=jnp.float32)

    @classmethod
    def of(
        cls, w, impl: str, splits: tuple[int, ...] | None = None, quant: str | None = None
    ) -> Linear:
        """The ``Linear`` of an [in, out] matrix for a resolved ``impl`` ("xla" | "ffi");
        ``quant="int8"`` ("ffi" only): stored as per-column int8 with float32 scales."""
        w = jnp.asarray(w)
        d_in, d_out = w.shape
        store = _store(w, impl, quant)
        packed = cpu_linear.pack(w, store) if impl == "ffi" else w
        return cls(packed, d_in, splits or (d_out,), impl)

    @classmethod
    def of_rows(cls, w_t, impl: str, quant: str | None = None) -> Linear:
        """The ``Linear`` of an [out, in] matrix (y = x @ w_tᵀ; a tied embedding as the LM head):
        packed for "ffi" (straight from the rows, no transposed copy first), read in place by
        XLA's dot for "xla"."""
        w_t = jnp.asarray(w_t)
        d_out, d_in = w_t.shape
        store = _store(w_t, impl, quant)
        if impl == "ffi":
            return cls(cpu_linear.pack_rows(w_t, store), d_in, (d_out,), impl)
        return cls(w_t, d_in, (d_out,), impl, transposed=True)

    def subset(self, ids: jax.Array) -> Linear:
        """The ``Linear`` of output columns ``ids`` [N] (a draft vocabulary's rows of the LM
        head), stored as this one is: the same values, bit for bit (an int8 weight keeps its
        columns' int8 values and scales; a screened head keeps those columns' screen)."""
        ids = jnp.asarray(ids, jnp.int32)
        if self.impl == "ffi":
            group = self.w.shape[2]

            def cut(wp):  # columns [N, in (+ scale rows)] as stored, packed again
                return cpu_linear.pack_raw_rows(cpu_linear.packed_columns(wp, ids), group)

            screen = None if self.screen is None else cut(self.screen)  # the same columns'
            return Linear(cut(self.w), self.d_in, (len(ids),), "ffi", screen=screen)
        return Linear.of(self.columns(ids), self.impl)

    def columns(self, ids: jax.Array) -> jax.Array:
        """Output columns ``ids`` [N] of the weight as an [in, N] matrix in its stored dtype
        (a draft vocabulary's rows of the LM head; int8: the float32 values q · scale)."""
        if self.impl == "ffi":
            return cpu_linear.as_stored(cpu_linear.packed_columns(self.w, ids)).T
        return jnp.take(self.w, ids, axis=0).T if self.transposed else jnp.take(self.w, ids, axis=1)

    def split(self, y: jax.Array) -> list[jax.Array]:
        """The fused output split back into its projections."""
        cuts, at = [], 0
        for s in self.splits[:-1]:
            at += s
            cuts.append(at)
        return jnp.split(y, cuts, axis=-1)


@jax.tree_util.register_pytree_node_class
class Embedding:
    """The token embedding of a decoding tree: ``emb[tokens]`` -> tokens.shape + [H] in
    ``dtype`` (the compute dtype; rows are gathered, then widened, never the whole table).
    ``w`` is the [V, H] table, or with ``packed`` the LM head's packed weight [groups, H, 128] of
    a tied model — the same array the head holds, so the table is stored once (row v is the
    head's column v: a strided gather of H values). A bf16 table is held as uint16 bit patterns
    (``cpu_linear.widen``: XLA:CPU would widen a whole bf16 table to gather from it)."""

    def __init__(self, w, packed: bool, dtype: str):
        self.w, self.packed, self.dtype = w, packed, dtype

    @classmethod
    def table(cls, w, dtype: str) -> Embedding:
        """An unpacked [V, H] table (bf16 stored as its bit patterns)."""
        if w.dtype == jnp.bfloat16:
            w = jax.jit(lambda t: jax.lax.bitcast_convert_type(t, jnp.uint16))(w)
        return cls(w, False, dtype)

    def tree_flatten(self):
        return (self.w,), (self.packed, self.dtype)

    @classmethod
    def tree_unflatten(cls, aux, children):
        return cls(children[0], *aux)

    def __repr__(self):
        return f"Embedding({'packed head' if self.packed else 'table'}, {self.dtype})"

    def _raw(self, ids) -> jax.Array:
        ids = jnp.asarray(ids, jnp.int32)
        if self.packed:
            return cpu_linear.packed_columns(self.w, ids)
        return jnp.take(self.w, ids, axis=0)

    def rows(self, ids) -> jax.Array:
        """Rows ``ids`` in the stored dtype."""
        return cpu_linear.as_stored(self._raw(ids))

    def __getitem__(self, tokens) -> jax.Array:
        return cpu_linear.widen(self._raw(tokens)).astype(self.dtype)  # bf16: exact either way


GREEDY_HEADS = ("auto", "screened", "full")
# "auto" screens the LM head from this many output columns on (a real vocabulary: Qwen3.5's
# 248,320): the screen costs int8 bytes of the head in memory and saves about half the bf16
# head's bytes per greedy step; a byte-level model's head is too small to matter.
SCREEN_MIN_VOCAB = 32768


def resolve_greedy_head(greedy_head: str, config, impl: str, quant: str | None = None) -> str:
    """How a decoding tree's LM head (``config``: a ``ModelConfig``'s) serves greedy rows:
    "screened" (``Linear.with_screen``: an int8 copy of the head beside it; greedy programs that
    keep no log-probabilities take each row's argmax through it, ``Linear.argmax`` — the same ids
    as the full head's, bit for bit, about half a bf16 head's bytes streamed) or "full" (the
    logits, then their argmax). "auto": "screened" with the C++ linear (``impl`` "ffi"), float32
    / bf16 matrices and a vocabulary of at least ``SCREEN_MIN_VOCAB``, else "full". ValueError
    for an unknown value, or "screened" where it cannot run (another linear; int8 matrices,
    already the screen's bytes)."""
    if greedy_head not in GREEDY_HEADS:
        raise ValueError(f"greedy_head must be one of {GREEDY_HEADS}, got {greedy_head!r}")
    can = impl == "ffi" and quant is None
    if greedy_head == "screened" and not can:
        why = f"linear resolved to {impl!r}" if impl != "ffi" else "the matrices are int8"
        raise ValueError(
            "greedy_head='screened' needs the C++ CPU linear and float32 / bf16 matrices; " + why
        )
    if greedy_head == "auto":
        return "screened" if can and config.vocab_size >= SCREEN_MIN_VOCAB else "full"
    return greedy_head
