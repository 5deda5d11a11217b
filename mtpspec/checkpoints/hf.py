"""Load an HF Qwen3-Next / Qwen3.5 safetensors checkpoint into the canonical parameter tree.

``load_hf(path)`` reads ``config.json`` (via ``from_hf_config``) and the weights (a single
``model.safetensors`` or a ``model.safetensors.index.json`` with its shards), maps HF tensor
names onto the layout documented in ``mtpspec.models.params`` (de-interleaving Qwen3-Next's
``in_proj_qkvz`` / ``in_proj_ba``, splitting attention ``q_proj`` into query and gate, stacking
experts, transposing Linear weights to [in, out]) and checks the result against
``param_shapes(config)``.

Everything that can be checked without reading tensor data (files present and readable, every
needed tensor present, no unconsumed tensor, every shape right) is checked before any tensor is
read, and each error names the offending path / tensor.

Ignored tensors (never an "unexpected tensor" error):
  * ``model.visual.*`` / ``visual.*`` (the released Qwen3.5 vision tower),
  * ``*.rotary_emb.inv_freq`` (derived buffers some exporters write),
  * ``lm_head.weight`` when ``tie_word_embeddings`` (the embedding is the head),
  * ``mtp.*`` when the config says ``mtp_num_layers == 0`` (HF drops them too).

MTP: when the config asks for an MTP layer but the checkpoint has no ``mtp.*`` tensor at all,
``load_hf`` raises ``ValueError`` unless ``allow_missing_mtp=True``; then the returned config has
``mtp_num_layers=0`` and the params have no ``"mtp"`` entry. A partially present MTP head is
always an error (missing tensor).
"""

from __future__ import annotations

import contextlib
import dataclasses
import functools
import os
from collections.abc import Callable

import jax
import jax.numpy as jnp
import numpy as np

from mtpspec import sharding
from mtpspec.checkpoints.hf_config import from_hf_config
from mtpspec.checkpoints.safetensors_files import (  # noqa: F401 - INDEX_FILE, SINGLE_FILE: hf_export
    INDEX_FILE,
    SINGLE_FILE,
    index_tensors,
    open_file,
    tensor_shapes,
)
from mtpspec.config import FULL, ModelConfig, check_dtype
from mtpspec.models.params import check_param_tree


@dataclasses.dataclass(frozen=True)
class TensorSpec:
    """HF tensors ``names`` (with on-disk ``shapes``) -> canonical leaves ``outs`` via ``fn``;
    ``inv`` is the exact inverse (canonical leaves -> HF tensors), used by ``save_hf``. Keeping
    both directions in one table is what makes export write exactly the layout import reads."""

    outs: tuple[tuple, ...]
    names: tuple[str, ...]
    shapes: tuple[tuple[int, ...], ...]
    fn: Callable[..., tuple[np.ndarray, ...]]
    inv: Callable[..., tuple[np.ndarray, ...]]


def _t(w):
    return (w.T,)


def _ident(w):
    return (w,)


def _one(out: tuple, name: str, shape: tuple, fn=_ident, inv=None) -> TensorSpec:
    """One tensor <-> one leaf; ``fn`` defaults to identity, ``inv`` to ``fn`` (self-inverse)."""
    return TensorSpec((out,), (name,), (tuple(shape),), fn, inv or fn)


def _linear(out: tuple, name: str, n_in: int, n_out: int) -> TensorSpec:
    """An HF Linear [out, in] <-> ours [in, out]."""
    return _one(out, name, (n_out, n_in), _t)


# --------------------------------------------------------------------------------------------
# per-module specs


def _dense_specs(base: tuple, p: str, h: int, i: int) -> list[TensorSpec]:
    return [
        _linear((*base, "w_gate"), f"{p}gate_proj.weight", h, i),
        _linear((*base, "w_up"), f"{p}up_proj.weight", h, i),
        _linear((*base, "w_down"), f"{p}down_proj.weight", i, h),
    ]


def _moe_specs(config: ModelConfig, base: tuple, p: str, names: set[str]) -> list[TensorSpec]:
    h, e, im = config.hidden_size, config.num_experts, config.moe_intermediate_size
    specs = [_linear((*base, "router"), f"{p}gate.weight", h, e)]
    fused = f"{p}experts.gate_up_proj"
    if fused in names:  # HF 5.x in-memory layout: [E, 2Im, H] (gate rows first), [E, H, Im]

        def split_gate_up(w):
            return w[:, :im, :].transpose(0, 2, 1), w[:, im:, :].transpose(0, 2, 1)

        def fuse_gate_up(w_gate, w_up):
            return (np.concatenate([w_gate, w_up], axis=2).transpose(0, 2, 1),)

        specs.append(
            TensorSpec(
                ((*base, "w_gate"), (*base, "w_up")),
                (fused,),
                ((e, 2 * im, h),),
                split_gate_up,
                fuse_gate_up,
            )
        )
        specs.append(
            _one(
                (*base, "w_down"),
                f"{p}experts.down_proj",
                (e, h, im),
                lambda w: (w.transpose(0, 2, 1),),
            )
        )
    else:  # per-expert tensors (every released checkpoint; what HF save_pretrained writes)

        def stack(*ws):
            return (np.stack([w.T for w in ws]),)

        def unstack(w):
            return tuple(w[j].T for j in range(e))

        for ours, theirs, shape in (
            ("w_gate", "gate_proj", (im, h)),
            ("w_up", "up_proj", (im, h)),
            ("w_down", "down_proj", (h, im)),
        ):
            specs.append(
                TensorSpec(
                    ((*base, ours),),
                    tuple(f"{p}experts.{j}.{theirs}.weight" for j in range(e)),
                    (shape,) * e,
                    stack,
                    unstack,
                )
            )
    if config.shared_expert_intermediate_size:
        specs += _dense_specs(
            (*base, "shared"), f"{p}shared_expert.", h, config.shared_expert_intermediate_size
        )
        specs.append(_linear((*base, "shared_gate"), f"{p}shared_expert_gate.weight", h, 1))
    return specs


def _attn_specs(config: ModelConfig, base: tuple, p: str) -> list[TensorSpec]:
    h, hd, hq, hkv = (
        config.hidden_size,
        config.head_dim,
        config.num_attention_heads,
        config.num_key_value_heads,
    )

    def split_q(w):  # [Hq·2·hd, H]: per head, hd query rows then hd gate rows
        w = w.reshape(hq, 2, hd, h)
        return w[:, 0].reshape(hq * hd, h).T, w[:, 1].reshape(hq * hd, h).T

    def join_q(w_q, w_gate):
        w = np.stack([w_q.T.reshape(hq, hd, h), w_gate.T.reshape(hq, hd, h)], axis=1)
        return (w.reshape(hq * 2 * hd, h),)

    return [
        TensorSpec(
            ((*base, "w_q"), (*base, "w_gate")),
            (f"{p}q_proj.weight",),
            ((hq * 2 * hd, h),),
            split_q,
            join_q,
        ),
        _linear((*base, "w_k"), f"{p}k_proj.weight", h, hkv * hd),
        _linear((*base, "w_v"), f"{p}v_proj.weight", h, hkv * hd),
        _linear((*base, "w_o"), f"{p}o_proj.weight", hq * hd, h),
        _one((*base, "q_norm"), f"{p}q_norm.weight", (hd,)),
        _one((*base, "k_norm"), f"{p}k_norm.weight", (hd,)),
    ]


def _gdn_specs(config: ModelConfig, base: tuple, p: str) -> list[TensorSpec]:
    h = config.hidden_size
    hk, hv = config.linear_num_key_heads, config.linear_num_value_heads
    dk, dv = config.linear_key_head_dim, config.linear_value_head_dim
    r, c, width = hv // hk, config.conv_channels, config.linear_conv_kernel_dim
    specs = []
    if config.family == "qwen3_next":
        group = 2 * dk + 2 * r * dv

        def split_qkvz(w):  # per key-head group g: [q_g (dk) | k_g (dk) | v_g (r·dv) | z_g (r·dv)]
            w = w.reshape(hk, group, h)
            q = w[:, :dk].reshape(hk * dk, h)
            k = w[:, dk : 2 * dk].reshape(hk * dk, h)
            v = w[:, 2 * dk : 2 * dk + r * dv].reshape(hv * dv, h)
            z = w[:, 2 * dk + r * dv :].reshape(hv * dv, h)
            return np.concatenate([q, k, v], axis=0).T, z.T

        def split_ba(w):  # per key-head group g: [b_g (r) | a_g (r)]
            w = w.reshape(hk, 2 * r, h)
            return w[:, :r].reshape(hv, h).T, w[:, r:].reshape(hv, h).T

        def interleave_qkvz(w_qkv, w_z):  # inverse of split_qkvz
            qkv = w_qkv.T
            q = qkv[: hk * dk].reshape(hk, dk, h)
            k = qkv[hk * dk : 2 * hk * dk].reshape(hk, dk, h)
            v = qkv[2 * hk * dk :].reshape(hk, r * dv, h)
            z = w_z.T.reshape(hk, r * dv, h)
            return (np.concatenate([q, k, v, z], axis=1).reshape(hk * group, h),)

        def interleave_ba(w_b, w_a):  # inverse of split_ba
            b, a = w_b.T.reshape(hk, r, h), w_a.T.reshape(hk, r, h)
            return (np.concatenate([b, a], axis=1).reshape(2 * hv, h),)

        specs += [
            TensorSpec(
                ((*base, "w_qkv"), (*base, "w_z")),
                (f"{p}in_proj_qkvz.weight",),
                ((hk * group, h),),
                split_qkvz,
                interleave_qkvz,
            ),
            TensorSpec(
                ((*base, "w_b"), (*base, "w_a")),
                (f"{p}in_proj_ba.weight",),
                ((2 * hv, h),),
                split_ba,
                interleave_ba,
            ),
        ]
    else:
        specs += [
            _linear((*base, "w_qkv"), f"{p}in_proj_qkv.weight", h, c),
            _linear((*base, "w_z"), f"{p}in_proj_z.weight", h, hv * dv),
            _linear((*base, "w_b"), f"{p}in_proj_b.weight", h, hv),
            _linear((*base, "w_a"), f"{p}in_proj_a.weight", h, hv),
        ]
    specs += [
        _one(
            (*base, "conv"),
            f"{p}conv1d.weight",
            (c, 1, width),
            lambda w: (w[:, 0, :],),
            lambda w: (w[:, None, :],),
        ),
        _one((*base, "A_log"), f"{p}A_log", (hv,)),
        _one((*base, "dt_bias"), f"{p}dt_bias", (hv,)),
        _one((*base, "norm"), f"{p}norm.weight", (dv,)),
        _linear((*base, "w_out"), f"{p}out_proj.weight", hv * dv, h),
    ]
    return specs


def _layer_specs(
    config: ModelConfig, base: tuple, p: str, layer_type: str, mlp_type: str, names: set[str]
) -> list[TensorSpec]:
    h = config.hidden_size
    specs = [
        _one((*base, "input_norm"), f"{p}input_layernorm.weight", (h,)),
        _one((*base, "post_norm"), f"{p}post_attention_layernorm.weight", (h,)),
    ]
    if layer_type == FULL:
        specs += _attn_specs(config, (*base, "attn"), f"{p}self_attn.")
    else:
        specs += _gdn_specs(config, (*base, "gdn"), f"{p}linear_attn.")
    if mlp_type == "moe":
        specs += _moe_specs(config, (*base, "mlp"), f"{p}mlp.", names)
    else:
        specs += _dense_specs((*base, "mlp"), f"{p}mlp.", h, config.intermediate_size)
    return specs


def model_specs(config: ModelConfig, prefix: str, names: set[str]) -> list[TensorSpec]:
    h, v = config.hidden_size, config.vocab_size
    specs = [
        _one(("embed",), f"{prefix}embed_tokens.weight", (v, h)),
        _one(("final_norm",), f"{prefix}norm.weight", (h,)),
    ]
    if not config.tie_word_embeddings:
        specs.append(_linear(("lm_head",), "lm_head.weight", h, v))
    for i, (lt, mt) in enumerate(zip(config.layer_types, config.mlp_types, strict=True)):
        specs += _layer_specs(config, ("layers", i), f"{prefix}layers.{i}.", lt, mt, names)
    if config.mtp_num_layers:
        specs += [
            _linear(("mtp", "fc"), "mtp.fc.weight", 2 * h, h),
            _one(("mtp", "norm_embed"), "mtp.pre_fc_norm_embedding.weight", (h,)),
            _one(("mtp", "norm_hidden"), "mtp.pre_fc_norm_hidden.weight", (h,)),
            _one(("mtp", "norm"), "mtp.norm.weight", (h,)),
        ]
        specs += _layer_specs(
            config, ("mtp", "layer"), "mtp.layers.0.", FULL, config.mtp_mlp_type, names
        )
    return specs


def _ignorable(name: str, config: ModelConfig) -> bool:
    return (
        name.startswith(("model.visual.", "visual."))
        or name.endswith("rotary_emb.inv_freq")
        or (name == "lm_head.weight" and config.tie_word_embeddings)
        or (name.startswith("mtp.") and not config.mtp_num_layers)
    )


def _set(tree: dict, path: tuple, value) -> None:
    node = tree
    for key in path[:-1]:
        node = node[key] if isinstance(node, list) else node.setdefault(key, {})
    node[path[-1]] = value


def load_hf(
    path: str | os.PathLike,
    *,
    dtype: str | None = None,
    allow_missing_mtp: bool = False,
    mesh=None,
    on_module: Callable[[ModelConfig, tuple, dict], dict] | None = None,
) -> tuple[ModelConfig, dict]:
    """Load an HF checkpoint directory -> (config, params) in the canonical layout.

    ``on_module(config, key, subtree)``: called as each decoder layer (key ("layers", i)), the
    MTP module (("mtp",)), the embedding (("embed",)) and an untied head (("lm_head",)) is
    complete, its return value replacing the subtree (a loader that
    converts the weights for decoding module by module: ``checkpoints.load(...,
    for_decoding=True)``); the final tree check is then the caller's.

    ``mesh`` (a (data, model) ``jax.sharding.Mesh``): each tensor, once converted, goes straight
    to its devices by the ``mtpspec.sharding`` rules, one device shard at a time (host memory
    holds one converted tensor at a time; on a multi-host mesh each process places only its own
    shards).

    ``dtype`` ("float32" | "bfloat16") overrides the config's dtype; the returned config carries
    the dtype the params were cast to. See the module docstring for ignored tensors and MTP.
    """
    path = os.fspath(path)
    if not os.path.isdir(path):
        raise OSError(f"HF checkpoint directory {path} does not exist")
    if not os.path.isfile(os.path.join(path, "config.json")):
        raise OSError(f"no config.json in {path}")
    config = from_hf_config(path)
    if dtype is not None:
        config = dataclasses.replace(config, dtype=check_dtype(dtype))

    where = index_tensors(path)
    names = set(where)
    prefix = (
        "model.language_model."
        if any(n.startswith("model.language_model.") for n in names)
        else "model."
    )

    if config.mtp_num_layers and not any(n.startswith("mtp.") for n in names):
        if not allow_missing_mtp:
            raise ValueError(
                f"config asks for {config.mtp_num_layers} MTP layer(s) but the checkpoint in "
                f"{path} has no mtp.* tensors (pass allow_missing_mtp=True to load without MTP)"
            )
        config = dataclasses.replace(config, mtp_num_layers=0)

    shardings = None
    if mesh is not None:
        shardings = sharding.param_shardings(config, mesh)
    specs = model_specs(config, prefix, names)
    needed = [n for s in specs for n in s.names]
    missing = [n for n in needed if n not in names]
    if missing:
        more = f" (and {len(missing) - 1} more)" if len(missing) > 1 else ""
        raise ValueError(f"checkpoint {path} is missing tensor {missing[0]}{more}")
    used = set(needed)
    unexpected = sorted(n for n in names - used if not _ignorable(n, config))
    if unexpected:
        more = f" (and {len(unexpected) - 1} more)" if len(unexpected) > 1 else ""
        raise ValueError(f"checkpoint {path} has unexpected tensor {unexpected[0]}{more}")
    shapes = tensor_shapes(where, needed)
    for s in specs:
        for n, want in zip(s.names, s.shapes, strict=True):
            if shapes[n] != want:
                raise ValueError(f"tensor {n} has shape {list(shapes[n])}, expected {list(want)}")

    params = _read_modules(config, where, specs, shardings, on_module)
    if on_module is None:
        check_param_tree(config, params)
    return config, params


def _read_modules(
    config: ModelConfig,
    where: dict[str, str],
    specs: list[TensorSpec],
    shardings,
    on_module: Callable[[ModelConfig, tuple, dict], dict] | None,
) -> dict:
    """The tensors of ``specs`` read and converted module by module (``load_hf``)."""
    # Tensor by tensor (one module's worth of host copies at a time). The files are opened per
    # module and closed after it: safetensors maps a whole file, and every page read stays in
    # the process's resident set while the mapping lives (1.5 GB of page cache counted twice
    # at real size).
    out_dtype = jnp.dtype(config.dtype)
    cpu = jax.devices("cpu")[0]
    params: dict = {"layers": [{} for _ in config.layer_types]}
    with contextlib.ExitStack() as outer:
        handles: dict = {}
        stack = outer.enter_context(contextlib.ExitStack())

        def read_as_is(n: str) -> jax.Array:
            file = where[n]
            if file not in handles:
                handles[file] = stack.enter_context(open_file(file))
            try:
                with jax.default_device(cpu):
                    return handles[file].get_tensor(n)
            except Exception as e:
                raise OSError(f"cannot read tensor {n} from {file}: {e}") from e

        def read(n: str) -> np.ndarray:
            return np.asarray(read_as_is(n))

        def close_files() -> None:
            stack.close()
            handles.clear()

        def module_of(spec: TensorSpec) -> tuple:
            first = spec.outs[0]
            return tuple(first[:2]) if first[0] == "layers" else tuple(first[:1])

        def finish(key: tuple) -> None:
            close_files()
            if on_module is not None and key[0] in ("layers", "mtp", "embed", "lm_head"):
                node = params["layers"] if key[0] == "layers" else params
                node[key[-1]] = on_module(config, key, node[key[-1]])

        current = None
        for s in specs:
            if module_of(s) != current:
                if current is not None:
                    finish(current)
                current = module_of(s)
            if s.fn is _ident and shardings is None:
                # the array as read, cast if asked (no host copies: the embedding is 0.5 GB at
                # Qwen3.5's vocabulary)
                value = read_as_is(s.names[0])
                _set(
                    params,
                    s.outs[0],
                    value if value.dtype == out_dtype else value.astype(out_dtype),
                )
                continue
            outs = s.fn(*(read(n) for n in s.names))
            for out_path, value in zip(s.outs, outs, strict=True):
                value = np.ascontiguousarray(value).astype(out_dtype, copy=False)
                if shardings is None:
                    _set(params, out_path, jnp.asarray(value))
                else:
                    leaf = functools.reduce(lambda t, k: t[k], out_path, shardings)
                    _set(params, out_path, sharding.place_host_array(value, leaf))
            del outs, value
        if current is not None:
            finish(current)
    return params
