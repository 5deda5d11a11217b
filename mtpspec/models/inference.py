"""Inference weights: projections fused at load, optionally packed for the C++ CPU linear.

    impl = resolve_linear("auto")                        # "ffi" on CPU when the kernel is built
    iparams = inference_params(config, params, impl)     # fused (and packed) copy, for decoding
    weights = decoding_weights(config, params)           # the same as a value ``generate`` takes

Canonical parameter trees (training, checkpoints, HF export, sharding) are never changed: this is
a separate tree made for decoding, in which

  * projections that read the same input are one ``Linear`` whose output is split afterwards
    (attention q|gate|k|v, GDN qkv|z|b|a, MLP gate|up), as serving engines do;
  * every other matrix (attention and GDN out-projections, MLP down, MTP fc, the LM head) is a
    ``Linear`` too;
  * the embedding is an ``Embedding``: with tied weights it *is* the LM head's weight (packed
    for the C++ linear, or the [V, H] matrix read transposed by XLA's dot), stored once.

A ``Linear`` with ``impl="ffi"`` holds its weight packed for ``kernels.cpu_linear`` and calls it
for any number of rows (decode steps, verify windows, prefills); ``impl="xla"`` keeps a plain
fused [in, out] matrix. Every attention block carries an ``AttentionCore`` marker: "ffi" runs
``kernels.cpu_attention`` for decode windows, "xla" XLA's form (``resolve_attention``,
``mark_attention``).

``generate(config, params)`` on a canonical tree builds (and memoises, ``MEMO``) the decoding
tree beside it: two copies of the weights while the caller keeps ``params``. A
``DecodingWeights`` (``decoding_weights(config, params)``, or ``checkpoints.load(path,
for_decoding=True)``, which converts layer by layer as it frees the canonical leaves) is the
decoding tree alone: one copy.
"""

from __future__ import annotations

import collections
import dataclasses
import logging
import threading

import jax
import jax.numpy as jnp

from mtpspec.config import ModelConfig
from mtpspec.kernels import cpu_attention, cpu_linear, library
from mtpspec.models.linear import Embedding, Linear, resolve_greedy_head

__all__ = ["Embedding", "Linear", "resolve_greedy_head"]  # re-exported: the decoding tree's

log = logging.getLogger(__name__)
LINEAR_IMPLS = ("auto", "xla", "ffi")

FUSED = {
    "attn": ("w_q", "w_gate", "w_k", "w_v"),
    "gdn": ("w_qkv", "w_z", "w_b", "w_a"),
    "mlp": ("w_gate", "w_up"),
}
SINGLE = {"attn": ("w_o",), "gdn": ("w_out",), "mlp": ("w_down",), "moe": ("router", "shared_gate")}


def fused_name(names: tuple[str, ...]) -> str:
    return "+".join(names)


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
        library.warn_if_missing()
    else:
        choice, reason = "ffi", f"cpu, C++ kernel {why}"
    if (what, choice, reason) not in _logged:
        _logged.add((what, choice, reason))
        log.info("%s='auto' -> %r (%s)", what, choice, reason)
    return choice


def compute_config(config: ModelConfig, linear: str) -> ModelConfig:
    """The config decoding computes with: a bfloat16 model on the C++ linear ("ffi") keeps its
    matrices bf16 in the packed kernel (half the bytes streamed per token) and computes in
    float32 — the arithmetic of transformers' float32 run on the same bf16 weights: the float32
    path's tokens on the weights widened, its log-probs to the last bits (logged once; bit for bit
    under LLVM -O0, docs/design.md). Otherwise ``config`` itself."""
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
    return _resolve("linear", impl, cpu_linear.KERNEL, sharded, platform)


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


def _block(kind: str, p: dict, impl: str, quant: str | None = None) -> dict:
    q = dict(p)
    names = FUSED.get(kind, ())
    if names and all(n in q for n in names):
        ws = [q.pop(n) for n in names]
        splits = tuple(int(w.shape[1]) for w in ws)
        q[fused_name(names)] = Linear.of(jnp.concatenate(ws, axis=1), impl, splits, quant)
    for n in SINGLE.get(kind, ()):
        if n in q:  # a MoE router and shared-expert gate stay as stored (tiny; they pick experts)
            q[n] = Linear.of(q[n], impl, quant=None if kind == "moe" else quant)
    if kind == "moe" and "shared" in q:
        q["shared"] = _block("mlp", q["shared"], impl, quant)
    return q


def _layer(config: ModelConfig, mlp_type: str, p: dict, impl: str, quant=None) -> dict:
    q = dict(p)
    for kind in ("attn", "gdn"):
        if kind in q:
            q[kind] = _block(kind, q[kind], impl, quant)
    q["mlp"] = _block("moe" if mlp_type == "moe" else "mlp", q["mlp"], impl, quant)
    return q


def inference_params(config, params: dict, impl: str, attention="xla", greedy_head="auto") -> dict:
    """The decoding tree for a canonical ``params`` (checked against ``config`` by the caller):
    fused projections as ``Linear`` leaves, packed when ``impl == "ffi"``; every attention block
    marked with its resolved ``attention`` implementation (``AttentionCore``); the LM head
    screened as ``greedy_head`` resolves (``resolve_greedy_head``)."""
    if impl not in ("xla", "ffi") or attention not in ("xla", "ffi"):
        raise ValueError(
            f"inference_params needs resolved implementations, got {impl!r}, {attention!r}"
        )
    screened = resolve_greedy_head(greedy_head, config, impl) == "screened"
    check_finite(params)
    tree = _convert(config, params, impl, consume=False, screened=screened)
    return mark_attention(tree, attention)


def _delete_unshared(canonical, made) -> None:
    """Delete the jax-array leaves of ``canonical`` that ``made`` does not hold itself."""
    kept = {id(x) for x in jax.tree_util.tree_leaves(made)}
    for x in jax.tree_util.tree_leaves(canonical):
        if isinstance(x, jax.Array) and id(x) not in kept and not x.is_deleted():
            x.delete()


def _is_converted(p) -> bool:
    leaves = jax.tree_util.tree_leaves(p, is_leaf=lambda x: isinstance(x, Linear))
    return any(isinstance(x, Linear) for x in leaves)


def convert_module(
    config: ModelConfig, key: tuple, p: dict, impl: str, consume: bool, quant: str | None = None
) -> dict:
    """One decoder layer (``key`` = ("layers", i)) or the MTP module (("mtp",)) of a canonical
    tree in the decoding layout, for the compute ``config`` (``compute_config``: a bf16 model
    decoded in float32 gets its vectors widened). ``consume``: delete the canonical leaves the
    result does not share (the caller owns the only reference). ``quant="int8"``: its ``Linear``
    matrices (the tied embedding's head included) stored as per-column int8 (``check_weights``)."""
    widen = _widen_vectors if config.dtype == "float32" else (lambda q: q)
    if key[0] == "layers":
        out = _layer(config, config.mlp_types[key[1]], widen(p), impl, quant)
    elif key == ("mtp",):
        out = widen(dict(p))
        out["fc"] = Linear.of(out["fc"], impl, quant=quant)
        out["layer"] = _layer(config, config.mtp_mlp_type, out["layer"], impl, quant)
    elif key == ("embed",):  # tied: packed as the head, which then shares this array
        if config.tie_word_embeddings and impl == "ffi":
            out = Embedding(Linear.of_rows(p, impl, quant).w, True, config.dtype)
        elif config.tie_word_embeddings:  # XLA's dot reads the table as the head, in place
            out = Embedding(p, False, config.dtype)
        else:
            out = Embedding.table(p, config.dtype)
    elif key == ("lm_head",):
        out = Linear.of(p, impl, quant=quant)
    else:
        raise ValueError(
            f"convert_module converts a layer, the MTP module or the embedding, not {key}"
        )
    if consume:
        _delete_unshared(p, out)
    return out


def _convert(config, params: dict, impl: str, consume: bool, quant=None, screened=False) -> dict:
    """The decoding tree (no attention markers), module by module (modules converted already,
    by a loader's ``convert_module`` calls, are kept). ``consume``: delete each canonical leaf
    the new tree does not share as soon as its module is converted, so the two copies are never
    both resident."""
    widen = _widen_vectors if config.dtype == "float32" else (lambda q: q)

    def module(key, p):
        done = isinstance(p, Embedding | Linear) or (isinstance(p, dict) and _is_converted(p))
        return p if done else convert_module(config, key, p, impl, consume, quant)

    rest = {k: v for k, v in params.items() if k not in ("layers", "embed", "lm_head", "mtp")}
    out = widen(rest)
    if consume:
        _delete_unshared(rest, out)
    out["layers"] = [module(("layers", i), p) for i, p in enumerate(params["layers"])]
    if "mtp" in params:
        out["mtp"] = module(("mtp",), params["mtp"])
    out["embed"] = emb = module(("embed",), params["embed"])
    if config.tie_word_embeddings:  # the head is the embedding's array
        h, v = config.hidden_size, config.vocab_size
        out["lm_head"] = Linear(emb.w, h, (v,), impl, transposed=not emb.packed)
    else:
        out["lm_head"] = module(("lm_head",), params["lm_head"])
    if screened:
        out["lm_head"] = out["lm_head"].with_screen()
    return out


def canonical_head(config: ModelConfig, params: dict) -> Linear:
    """The LM head of a canonical tree as an "xla" ``Linear`` over the same array (no copy)."""
    if config.tie_word_embeddings:
        return Linear.of_rows(params["embed"], "xla")
    return Linear.of(params["lm_head"], "xla")


def _widen_vectors(params):
    """Every bf16 leaf but the matrices that become ``Linear`` (packed in bf16) and the embedding
    table (gathered, then widened per row: ``Embedding``) as float32: norms, gates, conv taps."""
    matrices = {*SINGLE["attn"], *SINGLE["gdn"], *SINGLE["mlp"], *SINGLE["moe"], "fc", "lm_head"}
    matrices |= {n for names in FUSED.values() for n in names} | {"embed"}

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
        if isinstance(params, DecodingWeights):  # made already (host.prepare checked impl)
            tree = params.tree
        else:
            tree = self.cached(
                (config, impl), params, lambda: inference_params(config, params, impl, "xla")
            )
        return tree if attention == "xla" else mark_attention(tree, attention)


def check_finite_once(params) -> None:
    """``check_finite``, skipped for a tree whose jax-array leaves (by identity) passed it
    recently (``MEMO``); trees with numpy leaves are checked every time."""
    MEMO.cached("finite", params, lambda: check_finite(params))


MEMO = _Memo()


class DecodingWeights:
    """A model's weights in the decoding layout only (``decoding_weights`` or
    ``checkpoints.load(path, for_decoding=True)``): what ``generate`` and the rest of
    ``mtpspec.decoding`` run on, without the canonical tree beside it.

    ``config`` is the checkpoint's config (the one to pass to ``generate``), ``linear`` the
    implementation the matrices were made for ("ffi": packed for the C++ CPU linear; "xla"),
    ``tree`` the decoding tree. It cannot train, be exported or be sharded: those take the
    canonical tree. ``nbytes``: the bytes the weights hold."""

    def __init__(self, config: ModelConfig, tree: dict, linear: str, weights: str = "stored"):
        self.config, self.tree, self.linear, self.weights = config, tree, linear, weights
        screen = getattr(tree.get("lm_head"), "screen", None)
        self.greedy_head = "full" if screen is None else "screened"  # resolve_greedy_head's

    def __contains__(self, key) -> bool:
        return key in self.tree

    def __getitem__(self, key):
        return self.tree[key]

    def without_screen(self) -> DecodingWeights:
        """The same weights (shared arrays) with the LM head's screen left out: greedy rows then
        take the full logits' argmax (a screened head's comparison baseline; same tokens)."""
        tree = {**self.tree, "lm_head": self.tree["lm_head"].without_screen()}
        return DecodingWeights(self.config, tree, self.linear, self.weights)

    @property
    def nbytes(self) -> int:
        unique = {id(x): x for x in jax.tree_util.tree_leaves(self.tree)}  # embed = head: once
        return sum(x.nbytes for x in unique.values())

    def __repr__(self):
        return (
            f"DecodingWeights({len(self.config.layer_types)} layers, H {self.config.hidden_size}, "
            f"linear={self.linear!r}, weights={self.weights!r}, greedy_head="
            f"{self.greedy_head!r}, {self.nbytes / 2**30:.2f} GiB)"
        )

    def check_call(self, config: ModelConfig, linear: str, mesh) -> str:
        """The linear implementation a decoding call runs these weights with: ``linear``
        ("auto" -> the weights' own); ValueError for another config, another explicit
        implementation or a device mesh."""
        if config != self.config:
            raise ValueError(
                "these DecodingWeights were made for another config than the one passed "
                "(pass the config they were loaded or made with)"
            )
        if mesh is not None:
            raise ValueError(
                "DecodingWeights cannot be sharded over a device mesh; load the canonical tree "
                "(checkpoints.load without for_decoding) to decode under a mesh"
            )
        if linear not in ("auto", self.linear):
            raise ValueError(
                f"these DecodingWeights were made for linear={self.linear!r}; linear={linear!r} "
                "needs weights made for it (decoding_weights(config, params, linear=...))"
            )
        return self.linear


WEIGHTS = ("stored", "int8")


def check_weights(weights: str, linear: str) -> str | None:
    """The matrices' storage for ``DecodingWeights``: "stored" (the params' own dtype, float32 or
    bf16; exact) or "int8" (opt-in, lossy: symmetric per-output-column int8 with a float32 scale,
    ``cpu_linear.quantize``; the C++ linear only). int8 covers every ``Linear``: the attention,
    GDN and dense-MLP projections, a shared expert, the MTP fc and the LM head (a tied embedding
    with it); a MoE's routed experts (XLA einsums), its router and an untied embedding table stay
    as stored. Returns the quantisation (None or "int8");
    ValueError for an unknown value or int8 with another linear than "ffi"."""
    if weights not in WEIGHTS:
        raise ValueError(f"weights must be one of {WEIGHTS}, got {weights!r}")
    if weights == "int8" and linear != "ffi":
        raise ValueError(
            f"weights='int8' needs the C++ CPU linear (linear='ffi'); linear resolved to {linear!r}"
        )
    return "int8" if weights == "int8" else None


def decoding_weights(
    config: ModelConfig,
    params: dict,
    *,
    linear: str = "auto",
    consume: bool = False,
    weights: str = "stored",
    greedy_head: str = "auto",
) -> DecodingWeights:
    """The decoding layout of a canonical ``params`` (checked against ``config``) as a
    ``DecodingWeights``: fused projections, packed for the C++ linear when ``linear`` resolves
    to "ffi" (bf16 matrices stay bf16 there), the tied embedding stored once. Decoding it holds
    one copy of the weights once the canonical tree is dropped. ``consume=True`` deletes the
    canonical leaves module by module as they are converted (``params`` is unusable after; for
    a tree nothing else references, such as a fresh load). ``weights="int8"``: the ``Linear``
    matrices stored as per-column int8 (opt-in and lossy: ``check_weights``; for a dense model
    about half a bf16 model's bytes per decode step). ``greedy_head``: whether the LM head gets
    an int8 screen for greedy rows (``resolve_greedy_head``; "auto": a large vocabulary on the
    C++ linear; the result's ``greedy_head`` says which)."""
    from mtpspec.models.params import check_param_tree

    impl = resolve_linear(linear)
    quant = check_weights(weights, impl)
    screened = resolve_greedy_head(greedy_head, config, impl, quant) == "screened"
    check_param_tree(config, params, allow_missing_mtp=True)
    check_finite(params)
    return finish_decoding_weights(config, params, impl, consume, quant, screened)


def finish_decoding_weights(config, params, impl: str, consume: bool, quant=None, screened=False):
    """``DecodingWeights`` from a checked tree whose modules may already be converted
    (``convert_module``, called by a loader as each module completes); no checks."""
    tree = _convert(compute_config(config, impl), params, impl, consume, quant, screened)
    return DecodingWeights(config, tree, impl, quant or "stored")
