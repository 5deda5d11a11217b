"""The parameter pytree: plain nested dicts of arrays, in a canonical (de-interleaved) layout.

Weights are always function arguments (never static, never closed over). Linear weights are
stored [in, out] (y = x @ w). Layout, with H hidden, V vocab, Hq/Hkv/hd attention heads,
Hk/Hv/dk/dv GDN heads, C = 2·Hk·dk + Hv·dv conv channels, W conv width, E experts:

    params = {
      "embed": [V, H],
      "lm_head": [H, V]                      (absent when tie_word_embeddings: embed.T is used)
      "final_norm": [H],                     (1 + w) RMS norm
      "layers": [layer, ...],                one dict per decoder layer
      "mtp": {"fc": [2H, H], "norm_embed": [H], "norm_hidden": [H], "layer": layer,
              "norm": [H]}                   (absent when mtp_num_layers == 0)
    }
    layer = {"input_norm": [H], "post_norm": [H],
             "gdn" | "attn": mixer, "mlp": dense | moe}
    gdn   = {"w_qkv": [H, C] (columns [q (Hk·dk) | k (Hk·dk) | v (Hv·dv)], head-major),
             "w_z": [H, Hv·dv], "w_b": [H, Hv], "w_a": [H, Hv], "conv": [C, W],
             "A_log": [Hv], "dt_bias": [Hv], "norm": [dv] (plain w), "w_out": [Hv·dv, H]}
    attn  = {"w_q": [H, Hq·hd], "w_gate": [H, Hq·hd], "w_k": [H, Hkv·hd], "w_v": [H, Hkv·hd],
             "w_o": [Hq·hd, H], "q_norm": [hd], "k_norm": [hd]}
    dense = {"w_gate": [H, I], "w_up": [H, I], "w_down": [I, H]}
    moe   = {"router": [H, E], "w_gate": [E, H, Im], "w_up": [E, H, Im], "w_down": [E, Im, H],
             "shared": dense (intermediate Is), "shared_gate": [H, 1]}
"""

from __future__ import annotations

import math

import jax
import jax.numpy as jnp
import numpy as np

from mtpspec import compiled
from mtpspec.config import FULL, ModelConfig


def _dense_shapes(h: int, i: int) -> dict:
    return {"w_gate": (h, i), "w_up": (h, i), "w_down": (i, h)}


def _mlp_shapes(config: ModelConfig, kind: str) -> dict:
    h = config.hidden_size
    if kind == "dense":
        return _dense_shapes(h, config.intermediate_size)
    e, im = config.num_experts, config.moe_intermediate_size
    out = {"router": (h, e), "w_gate": (e, h, im), "w_up": (e, h, im), "w_down": (e, im, h)}
    if config.shared_expert_intermediate_size:
        out["shared"] = _dense_shapes(h, config.shared_expert_intermediate_size)
        out["shared_gate"] = (h, 1)
    return out


def _attn_shapes(config: ModelConfig) -> dict:
    h, hd = config.hidden_size, config.head_dim
    q, kv = config.num_attention_heads * hd, config.num_key_value_heads * hd
    return {
        "w_q": (h, q),
        "w_gate": (h, q),
        "w_k": (h, kv),
        "w_v": (h, kv),
        "w_o": (q, h),
        "q_norm": (hd,),
        "k_norm": (hd,),
    }


def _gdn_shapes(config: ModelConfig) -> dict:
    h, hv, dv = config.hidden_size, config.linear_num_value_heads, config.linear_value_head_dim
    return {
        "w_qkv": (h, config.conv_channels),
        "w_z": (h, hv * dv),
        "w_b": (h, hv),
        "w_a": (h, hv),
        "conv": (config.conv_channels, config.linear_conv_kernel_dim),
        "A_log": (hv,),
        "dt_bias": (hv,),
        "norm": (dv,),
        "w_out": (hv * dv, h),
    }


def _layer_shapes(config: ModelConfig, layer_type: str, mlp_type: str) -> dict:
    h = config.hidden_size
    mixer = ("attn", _attn_shapes(config)) if layer_type == FULL else ("gdn", _gdn_shapes(config))
    return {
        "input_norm": (h,),
        "post_norm": (h,),
        mixer[0]: mixer[1],
        "mlp": _mlp_shapes(config, mlp_type),
    }


def param_shapes(config: ModelConfig) -> dict:
    """The expected shape of every parameter (same tree as ``init_params``)."""
    h, v = config.hidden_size, config.vocab_size
    shapes: dict = {
        "embed": (v, h),
        "final_norm": (h,),
        "layers": [
            _layer_shapes(config, lt, mt)
            for lt, mt in zip(config.layer_types, config.mlp_types, strict=True)
        ],
    }
    if not config.tie_word_embeddings:
        shapes["lm_head"] = (h, v)
    if config.mtp_num_layers:
        shapes["mtp"] = {
            "fc": (2 * h, h),
            "norm_embed": (h,),
            "norm_hidden": (h,),
            "layer": _layer_shapes(config, FULL, config.mtp_mlp_type),
            "norm": (h,),
        }
    return shapes


def _is_shape(x) -> bool:
    return isinstance(x, tuple) and all(isinstance(d, int) for d in x)


def _bucket(size: int) -> int:
    """The draw length for a leaf of ``size`` elements: the next power of two from 256 up to 2^20,
    then the next multiple of 2^20 (at most 2x the elements for small leaves, under 1 % more for
    big ones)."""
    if size <= 1 << 20:
        return max(256, 1 << (size - 1).bit_length())
    return -(-size // (1 << 20)) << 20


def _draw(key: jax.Array, n: int, uniform: bool, lo: jax.Array, hi: jax.Array) -> jax.Array:
    if uniform:
        return jax.random.uniform(key, (n,), minval=lo, maxval=hi)
    return jax.random.normal(key, (n,))


_draw_jit = compiled.jit(_draw, static_argnums=(1, 2))
_A_LOG_RANGE = (np.float32(0.1), np.float32(1.5))  # traced bounds, as jax.random.uniform's own


def _sample(key: jax.Array, shape: tuple, uniform: bool = False) -> np.ndarray:
    """``jax.random.normal(key, shape)`` (or ``uniform(key, shape, 0.1, 1.5)``) as float32 numpy,
    bit for bit: the threefry draws are prefix-consistent (element i depends only on the key and
    i), so the first prod(shape) elements of a longer draw are these. Drawing ``_bucket`` lengths
    compiles one small program per length bucket instead of one per leaf shape (a fresh process
    had initialised the tiny test model in ~3 s of compiles)."""
    size = math.prod(shape)
    flat = np.asarray(_draw_jit(key, _bucket(size), uniform, *_A_LOG_RANGE))
    return flat[:size].reshape(shape)


def init_params(config: ModelConfig, key: jax.Array, *, norm_scale: float = 0.0) -> dict:
    """Random parameters. ``norm_scale`` > 0 draws the (1 + w) norm weights as norm_scale·N(0, 1)
    (tests want non-trivial norms); 0 gives HF's zero init. Each leaf is drawn from its own key
    of ``jax.random.split(key, n_leaves)`` (tree order): ``jax.random.normal`` (uniform for
    ``A_log``), scaled in float32 (numpy's IEEE products and sums: the same bits as jnp's)."""
    dtype = jnp.dtype(config.dtype)
    shapes = param_shapes(config)
    leaves, treedef = jax.tree_util.tree_flatten_with_path(shapes, is_leaf=_is_shape)
    keys = jax.random.split(key, len(leaves))
    out = []
    f32 = np.float32
    for i, (path, shape) in enumerate(leaves):
        k = keys[i]
        name = str(getattr(path[-1], "key", ""))
        if name == "A_log":
            x = jnp.log(jnp.asarray(_sample(k, shape, uniform=True)))
        else:
            z = _sample(k, shape)
            if name == "dt_bias":
                x = f32(0.5) * z
            elif name == "norm" and len(path) >= 2 and getattr(path[-2], "key", "") == "gdn":
                x = f32(1.0) + f32(0.1) * z  # plain-w gated norm
            elif len(shape) == 1:  # (1 + w) norms
                x = f32(norm_scale) * z
            elif name == "embed":
                x = f32(0.5) * z
            else:  # linear [.., in, out]
                x = z * f32(shape[-2] ** -0.5)
        out.append(jnp.asarray(x, dtype))
    return jax.tree_util.tree_unflatten(treedef, out)


def check_param_tree(
    config: ModelConfig, params, *, name: str = "params", allow_missing_mtp: bool = False
) -> None:
    """Raise ValueError / TypeError unless ``params`` has exactly this config's parameter tree
    (``param_shapes``): the same keys, and every leaf an array of the expected shape. Cheap (shapes
    only, no device work); every entry point that takes weights calls it.
    ``allow_missing_mtp``: a tree without any ``"mtp"`` entry is fine (decoding without the MTP
    proposer does not need the head; the MTP proposer checks for it itself)."""
    if not isinstance(params, dict):
        raise TypeError(f"{name} must be a parameter tree (dict), got {type(params).__name__}")
    shapes = param_shapes(config)
    if allow_missing_mtp and "mtp" not in params:
        shapes.pop("mtp", None)
    want = dict(jax.tree_util.tree_flatten_with_path(shapes, is_leaf=_is_shape)[0])
    got = dict(jax.tree_util.tree_flatten_with_path(params)[0])
    if want.keys() != got.keys():
        missing = sorted(jax.tree_util.keystr(k) for k in want.keys() - got.keys())
        extra = sorted(jax.tree_util.keystr(k) for k in got.keys() - want.keys())

        def some(names):
            shown = ", ".join(names[:4]) + (", ..." if len(names) > 4 else "")
            return f"{len(names)} ({shown})" if names else "0"

        raise ValueError(
            f"{name} do not match the config's parameter tree: missing {some(missing)}, "
            f"unexpected {some(extra)}"
        )
    for path, shape in want.items():
        leaf = got[path]
        if not hasattr(leaf, "shape"):
            raise TypeError(
                f"{name}{jax.tree_util.keystr(path)} must be an array, got {type(leaf).__name__}"
            )
        if tuple(leaf.shape) != shape:
            raise ValueError(
                f"{name}{jax.tree_util.keystr(path)} has shape {tuple(leaf.shape)}, the config "
                f"says {shape}"
            )
