"""Inference weights: projections fused at load, optionally packed for the C++ CPU linear.

    impl = resolve_linear("auto")                        # "ffi" on CPU when the kernel is built
    iparams = inference_params(config, params, impl)     # fused (and packed) copy, for decoding

Canonical parameter trees (training, checkpoints, HF export, sharding) are never changed: this is
a separate tree made for decoding, in which

  * projections that read the same input are one ``Linear`` whose output is split afterwards
    (attention q|gate|k|v, GDN qkv|z|b|a, MLP gate|up), as serving engines do;
  * every other matrix (attention and GDN out-projections, MLP down, MTP fc, the LM head — the
    transposed embedding when tied) is a ``Linear`` too.

A ``Linear`` with ``impl="ffi"`` holds its weight packed for ``kernels.cpu_linear`` and calls it
for up to ``FFI_MAX_ROWS`` rows (the decode step, the verify window, a prompt of up to 256
tokens); beyond that (longer prefills) it unpacks in the program and uses XLA's dot.
``impl="xla"`` keeps a plain fused [in, out] matrix.
Every attention block carries an ``AttentionCore`` marker: "ffi" runs ``kernels.cpu_attention``
for decode windows, "xla" XLA's form (``resolve_attention``, ``mark_attention``).
"""

from __future__ import annotations

import collections
import dataclasses
import logging
import math
import threading

import jax
import jax.numpy as jnp
from jax.lax import Precision

from mtpspec.config import ModelConfig
from mtpspec.kernels import cpu_attention, cpu_linear

log = logging.getLogger(__name__)
HIGHEST = Precision.HIGHEST
LINEAR_IMPLS = ("auto", "xla", "ffi")
# rows (batch × window) up to which the C++ kernel is used, XLA's dot on the unpacked weight
# beyond: a 160-token prefill of the default model took 25 ms through the kernel, 37-42 ms
# unpacking, 26 ms with linear="xla" (BUILD_NOTES 2026-12-02, fourth session)
FFI_MAX_ROWS = 256

FUSED = {
    "attn": ("w_q", "w_gate", "w_k", "w_v"),
    "gdn": ("w_qkv", "w_z", "w_b", "w_a"),
    "mlp": ("w_gate", "w_up"),
}
SINGLE = {"attn": ("w_o",), "gdn": ("w_out",), "mlp": ("w_down",), "moe": ("router", "shared_gate")}


def fused_name(names: tuple[str, ...]) -> str:
    return "+".join(names)


@jax.tree_util.register_pytree_node_class
class Linear:
    """y = x @ W for an inference weight: ``w`` is [in, out] ("xla") or packed [tiles, in, 16]
    ("ffi"); ``splits`` are the output widths of the projections fused in it."""

    def __init__(self, w, d_in: int, splits: tuple[int, ...], impl: str):
        self.w, self.d_in, self.splits, self.impl = w, d_in, tuple(splits), impl

    @property
    def d_out(self) -> int:
        return sum(self.splits)

    def tree_flatten(self):
        return (self.w,), (self.d_in, self.splits, self.impl)

    @classmethod
    def tree_unflatten(cls, aux, children):
        return cls(children[0], *aux)

    def __repr__(self):
        return f"Linear({self.d_in}->{self.splits}, impl={self.impl!r})"

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
        if self.impl == "ffi" and rows <= FFI_MAX_ROWS:
            y = cpu_linear.apply(x.reshape(rows, *inner), self.w, self.d_out)
            return y.reshape(*lead, self.d_out)
        x = x.reshape(*lead, self.d_in)
        w = cpu_linear.unpack(self.w, self.d_out) if self.impl == "ffi" else self.w
        return jnp.matmul(
            x, w.astype(x.dtype), precision=HIGHEST, preferred_element_type=jnp.float32
        )

    @classmethod
    def of(cls, w, impl: str, splits: tuple[int, ...] | None = None) -> Linear:
        """The ``Linear`` of an [in, out] matrix for a resolved ``impl`` ("xla" | "ffi")."""
        w = jnp.asarray(w)
        d_in, d_out = w.shape
        # bf16 weights stay bf16 in the packed kernel (widened exactly in registers)
        store = jnp.bfloat16 if w.dtype == jnp.bfloat16 else jnp.float32
        packed = cpu_linear.pack(w, store) if impl == "ffi" else w
        return cls(packed, d_in, splits or (d_out,), impl)

    def split(self, y: jax.Array) -> list[jax.Array]:
        """The fused output split back into its projections."""
        cuts, at = [], 0
        for s in self.splits[:-1]:
            at += s
            cuts.append(at)
        return jnp.split(y, cuts, axis=-1)


_logged: set = set()


def _resolve(what: str, impl: str, kernel, sharded: bool, platform: str | None) -> str:
    """``impl`` checked and "auto" resolved for one of the C++ CPU kernels (``kernel``: its
    ``status``/``require``): "ffi" on CPU when it is built, else "xla" (logged, once per
    choice). Under a device mesh only "xla" runs; an explicit "ffi" there, on a non-CPU platform,
    or without the kernel raises ValueError / OSError."""
    if impl not in LINEAR_IMPLS:
        raise ValueError(f"unknown {what} implementation {impl!r}; expected one of {LINEAR_IMPLS}")
    platform = platform or jax.default_backend()
    if impl == "ffi":
        if sharded:
            raise ValueError(
                f"{what}='ffi' cannot run under a device mesh (the C++ kernels take unsharded "
                f"operands); use {what}='xla' or 'auto'"
            )
        if platform != "cpu":
            raise ValueError(f"{what}='ffi' is a CPU kernel; the platform here is {platform!r}")
        kernel.require()
        return "ffi"
    if impl == "xla":
        return "xla"
    ok, why = kernel.status()
    if sharded:
        choice, reason = "xla", "under a device mesh"
    elif platform != "cpu":
        choice, reason = "xla", f"platform {platform!r} is not cpu"
    elif not ok:
        choice, reason = "xla", why
    else:
        choice, reason = "ffi", f"cpu, C++ kernel {why}"
    if (what, choice, reason) not in _logged:
        _logged.add((what, choice, reason))
        log.info("%s='auto' -> %r (%s)", what, choice, reason)
    return choice


def compute_config(config: ModelConfig, linear: str) -> ModelConfig:
    """The config decoding computes with: a bfloat16 model on the C++ linear ("ffi") keeps its
    matrices bf16 in the packed kernel (half the bytes streamed per token) and computes in
    float32 — the arithmetic of transformers' float32 run on the same bf16 weights, and bit for
    bit the float32 path's on the weights widened (logged once). Otherwise ``config`` itself."""
    if linear != "ffi" or config.dtype != "bfloat16":
        return config
    if ("bf16 storage",) not in _logged:
        _logged.add(("bf16 storage",))
        log.info(
            "bfloat16 weights: decoding keeps the matrices bf16 in the C++ linear and "
            "computes in float32"
        )
    return dataclasses.replace(config, dtype="float32")


def resolve_linear(impl: str, *, sharded: bool = False, platform: str | None = None) -> str:
    """Check a linear implementation name and resolve "auto": "ffi" on CPU when the C++ kernel is
    available, else "xla" (logged with the reason, once per choice). Under a device mesh only
    "xla" runs (the fused / packed trees are not sharded); an explicit "ffi" there, on a non-CPU
    platform, or without the kernel raises ValueError / OSError."""
    choice = _resolve("linear", impl, cpu_linear.KERNEL, sharded, platform)
    if choice == "ffi":
        isa = cpu_linear.isa_name()  # raises for an unknown or unsupported cpu_linear.ISA
        if ("linear isa", cpu_linear.ISA, isa) not in _logged:
            _logged.add(("linear isa", cpu_linear.ISA, isa))
            log.info("CPU linear kernel: isa %r -> %r", cpu_linear.ISA, isa)
    return choice


def resolve_attention(
    impl: str,
    *,
    sharded: bool = False,
    platform: str | None = None,
    cache_dtype: str = "float32",
) -> str:
    """The same for the attention of decode steps and verify windows: "ffi" is the C++ kernel
    (``kernels/cpu_attention.cc``: the live cache prefix only), "xla" XLA's form. "auto" keeps
    XLA's form for a cache that is not float32 (the kernel would convert the whole cache on every
    call); an explicit "ffi" still runs there."""
    if impl == "auto" and cache_dtype != "float32":
        return _resolve("attention", "xla", cpu_attention.KERNEL, sharded, platform)
    return _resolve("attention", impl, cpu_attention.KERNEL, sharded, platform)


@jax.tree_util.register_pytree_node_class
class AttentionCore:
    """A leafless marker in a decoding tree's attention block: how its softmax attention runs
    ("ffi" | "xla"). Static, so it is part of the tree's structure (and of the compiled
    program's cache key)."""

    def __init__(self, impl: str):
        self.impl = impl

    def tree_flatten(self):
        return (), self.impl

    @classmethod
    def tree_unflatten(cls, aux, children):
        return cls(aux)

    def __repr__(self):
        return f"AttentionCore({self.impl!r})"


def _block(kind: str, p: dict, impl: str) -> dict:
    q = dict(p)
    names = FUSED.get(kind, ())
    if names and all(n in q for n in names):
        ws = [q.pop(n) for n in names]
        splits = tuple(int(w.shape[1]) for w in ws)
        q[fused_name(names)] = Linear.of(jnp.concatenate(ws, axis=1), impl, splits)
    for n in SINGLE.get(kind, ()):
        if n in q:
            q[n] = Linear.of(q[n], impl)
    if kind == "moe" and "shared" in q:
        q["shared"] = _block("mlp", q["shared"], impl)
    return q


def _layer(config: ModelConfig, mlp_type: str, p: dict, impl: str) -> dict:
    q = dict(p)
    for kind in ("attn", "gdn"):
        if kind in q:
            q[kind] = _block(kind, q[kind], impl)
    q["mlp"] = _block("moe" if mlp_type == "moe" else "mlp", q["mlp"], impl)
    return q


def inference_params(config: ModelConfig, params: dict, impl: str, attention: str = "xla") -> dict:
    """The decoding tree for a canonical ``params`` (checked against ``config`` by the caller):
    fused projections as ``Linear`` leaves, packed when ``impl == "ffi"``; every attention block
    marked with its resolved ``attention`` implementation (``AttentionCore``)."""
    if impl not in ("xla", "ffi") or attention not in ("xla", "ffi"):
        raise ValueError(
            f"inference_params needs resolved implementations, got {impl!r}, {attention!r}"
        )
    check_finite(params)
    stored = params
    if config.dtype == "float32":  # a bf16 model decoded in float32 (``compute_config``)
        params = _widen_vectors(params)
    out = dict(params)
    out["layers"] = [
        _layer(config, config.mlp_types[i], p, impl) for i, p in enumerate(params["layers"])
    ]
    head = stored["embed"].T if config.tie_word_embeddings else params["lm_head"]
    out["lm_head"] = Linear.of(head, impl)
    if "mtp" in params:
        mtp = dict(params["mtp"])
        mtp["fc"] = Linear.of(mtp["fc"], impl)
        mtp["layer"] = _layer(config, config.mtp_mlp_type, mtp["layer"], impl)
        out["mtp"] = mtp
    return mark_attention(out, attention)


def _widen_vectors(params):
    """Every bf16 leaf but the matrices that become ``Linear`` (packed in bf16) as float32:
    norms, gates, conv taps, the embedding rows gathered per token."""
    matrices = {*SINGLE["attn"], *SINGLE["gdn"], *SINGLE["mlp"], *SINGLE["moe"], "fc", "lm_head"}
    matrices |= {n for names in FUSED.values() for n in names}

    def widen(path, x):
        name = str(getattr(path[-1], "key", ""))
        keep = name in matrices and x.ndim == 2
        return x if keep or x.dtype != jnp.bfloat16 else x.astype(jnp.float32)

    return jax.tree_util.tree_map_with_path(widen, params)


def mark_attention(tree: dict, attention: str) -> dict:
    """A decoding tree with every attention block's marker set to ``attention`` (a shallow copy:
    the weights are shared)."""

    def layer(p):
        return {**p, "attn": {**p["attn"], "core": AttentionCore(attention)}} if "attn" in p else p

    out = {**tree, "layers": [layer(p) for p in tree["layers"]]}
    if "mtp" in tree:
        out["mtp"] = {**tree["mtp"], "layer": layer(tree["mtp"]["layer"])}
    return out


def check_finite(params) -> None:
    """ValueError naming the first weight with a NaN or infinity (one reduction per leaf; run once
    per parameter set, when its decoding tree is made, so a NaN checkpoint cannot decode into
    silent garbage)."""
    leaves = [
        (path, x)
        for path, x in jax.tree_util.tree_leaves_with_path(params)
        if jnp.issubdtype(x.dtype, jnp.floating)
    ]
    finite = jax.device_get([jnp.all(jnp.isfinite(x)) for _, x in leaves])
    for (path, _), ok in zip(leaves, finite):
        if not ok:
            raise ValueError(f"parameter {jax.tree_util.keystr(path)} holds NaN or infinite values")


class _Memo:
    """The last few results computed from a parameter tree, keyed by a tag and the identity of
    every leaf (jax arrays are immutable, and the leaves are held so their ids stay unique);
    trees with mutable (numpy) leaves are computed afresh on every call. Safe under threads (one
    lock: two threads asking for the same tree compute it once)."""

    def __init__(self, size: int = 4):
        self.size = size
        self.entries: collections.OrderedDict = collections.OrderedDict()
        self._lock = threading.RLock()

    def cached(self, tag, params, compute):
        """``compute()``, or its result for the same tag and leaves among the last ``size``."""
        leaves = jax.tree_util.tree_leaves(params)
        if not all(isinstance(x, jax.Array) for x in leaves):
            return compute()
        key = (tag, tuple(id(x) for x in leaves))
        with self._lock:
            hit = self.entries.get(key)
            if hit is not None:
                self.entries.move_to_end(key)
                return hit[1]
            result = compute()
            self.entries[key] = (leaves, result)
            while len(self.entries) > self.size:
                self.entries.popitem(last=False)
            return result

    def clear(self) -> None:
        with self._lock:
            self.entries.clear()

    def get(self, config: ModelConfig, params, impl: str, attention: str = "xla"):
        """The inference tree of ``params`` (``inference_params``), memoised by linear
        implementation: the attention markers go on a shallow copy that shares its leaves."""
        tree = self.cached(
            (config, impl), params, lambda: inference_params(config, params, impl, "xla")
        )
        return tree if attention == "xla" else mark_attention(tree, attention)


def check_finite_once(params) -> None:
    """``check_finite``, skipped for a tree whose jax-array leaves (by identity) passed it
    recently (``MEMO``); trees with numpy leaves are checked every time."""
    MEMO.cached("finite", params, lambda: check_finite(params))


MEMO = _Memo()
