"""Sharding over a device mesh with ``data`` and ``model`` axes (JAX SPMD, no home-made engine).

Rules (Megatron-style tensor parallelism on ``model``, data parallelism on ``data``):

* attention: query/gate/key/value projections split by heads (columns), ``w_o`` by rows; the KV
  caches [b, h_kv, n, d] split on their heads like ``w_k`` / ``w_v``;
* GDN: ``w_qkv`` / ``conv`` split on their channels, ``w_z`` / ``w_b`` / ``w_a`` / ``A_log`` /
  ``dt_bias`` on value heads, ``w_out`` by rows; the recurrent state [b, h_v, k, v] on value heads
  and the conv window [b, w − 1, c] on channels, each exactly as the weight that writes it;
* MLP: hidden (intermediate) dim split; MoE: experts split (expert parallelism), router replicated;
* embedding split on the vocabulary (rows), an untied ``lm_head`` on its vocabulary columns;
* norms, the MTP ``fc`` and scalars replicated; batch (decode state, prompts, training batches)
  on ``data``; parameters are replicated over ``data``.

A dimension that does not divide by the ``model`` axis size is replicated on that axis (the
weight and the state it writes together, so they stay consistent): e.g. Qwen3-Next's 2 KV heads on
a model axis of 8. ``describe`` lists every such leaf; ``memory_estimate`` accounts for it.

Mesh axis types: the model is written for GSPMD's automatic propagation. ``Auto`` meshes are used
as they are; an ``Explicit`` mesh (``jax.make_mesh``'s default in new JAX) is accepted and run as
the ``Auto`` mesh over the same devices and axis names (``auto_mesh``). Tokens are the same either
way (tested).
"""

from __future__ import annotations

import dataclasses
import functools
import math
from collections.abc import Mapping, Sequence

import jax
import numpy as np
from jax.sharding import AxisType, Mesh, NamedSharding
from jax.sharding import PartitionSpec as P

from mtpspec import compiled
from mtpspec.config import FULL, ModelConfig
from mtpspec.models.params import check_param_tree, param_shapes
from mtpspec.models.state import AttentionCache, DecodeState, GDNCache, init_decode_state

DATA, MODEL = "data", "model"
AXES = (DATA, MODEL)


# ---- meshes -------------------------------------------------------------------------------------


def make_mesh(
    data: int = 1,
    model: int | None = None,
    *,
    axis_types: str = "auto",
    devices: Sequence | None = None,
) -> Mesh:
    """A (data, model) mesh over ``devices`` (default: all). ``model=None`` takes every device not
    used by ``data``. ``axis_types``: "auto" (what mtpspec runs) or "explicit" (accepted and run as
    auto; for users whose code around mtpspec uses explicit sharding)."""
    devices = list(jax.devices() if devices is None else devices)
    for name, v in (("data", data), ("model", model)):
        if v is not None and (isinstance(v, bool) or not isinstance(v, int) or v < 1):
            raise ValueError(f"{name} axis size must be a positive int, got {v!r}")
    if model is None:
        if len(devices) % data:
            raise ValueError(f"{len(devices)} devices do not split into data={data} rows")
        model = len(devices) // data
    if data * model > len(devices):
        raise ValueError(
            f"mesh data={data} x model={model} needs {data * model} devices, "
            f"only {len(devices)} available"
        )
    if axis_types not in ("auto", "explicit"):
        raise ValueError(f"axis_types must be 'auto' or 'explicit', got {axis_types!r}")
    kind = AxisType.Auto if axis_types == "auto" else AxisType.Explicit
    if data * model == len(devices):  # JAX's own topology-aware device order
        return jax.make_mesh((data, model), AXES, axis_types=(kind, kind), devices=devices)
    grid = np.asarray(devices[: data * model], dtype=object).reshape(data, model)
    return Mesh(grid, AXES, axis_types=(kind, kind))


def initialize_distributed(
    coordinator_address: str | None = None,
    num_processes: int | None = None,
    process_id: int | None = None,
) -> None:
    """Multi-host start-up: ``jax.distributed.initialize`` (call before any other JAX work, in
    every process). With no arguments JAX detects the cluster (SLURM, Open MPI, Cloud TPU);
    otherwise give all three. After it, ``jax.devices()`` lists every host's devices and a
    ``make_mesh`` over them spans the hosts (model axis within a host, data across hosts)."""
    given = [coordinator_address is not None, num_processes is not None, process_id is not None]
    if any(given) and not all(given):
        raise ValueError(
            "give coordinator_address, num_processes and process_id together "
            "(or none of them, for JAX's cluster auto-detection)"
        )
    if all(given):
        if not isinstance(num_processes, int) or num_processes < 1:
            raise ValueError(f"num_processes must be a positive int, got {num_processes!r}")
        if not isinstance(process_id, int) or not 0 <= process_id < num_processes:
            raise ValueError(f"process_id must be in [0, {num_processes}), got {process_id!r}")
        if ":" not in str(coordinator_address):
            raise ValueError(f"coordinator_address must be host:port, got {coordinator_address!r}")
        jax.distributed.initialize(coordinator_address, num_processes, process_id)
    else:
        jax.distributed.initialize()


def parse_mesh(text: str) -> tuple[int, int]:
    """ "DxM" (e.g. "2x4") -> (data, model); the experiment scripts' ``--mesh`` flag."""
    parts = str(text).lower().split("x")
    if len(parts) != 2 or not all(p.strip().isdigit() and int(p) > 0 for p in parts):
        raise ValueError(f"mesh must look like DATAxMODEL (e.g. 2x4), got {text!r}")
    return int(parts[0]), int(parts[1])


def check_mesh(mesh) -> Mesh:
    """Validate a user mesh and return the Auto-typed mesh mtpspec runs on (same devices)."""
    if not isinstance(mesh, Mesh):
        raise TypeError(f"mesh must be a jax.sharding.Mesh, got {type(mesh).__name__}")
    names = tuple(mesh.axis_names)
    if set(names) != set(AXES) or len(names) != 2:
        raise ValueError(
            f"mesh axes must be exactly {AXES} (mtpspec.sharding.make_mesh builds one), got {names}"
        )
    return auto_mesh(mesh)


def auto_mesh(mesh: Mesh) -> Mesh:
    """The same devices and axis names with every axis Auto (GSPMD propagation)."""
    if all(t == AxisType.Auto for t in mesh.axis_types):
        return mesh
    return Mesh(mesh.devices, mesh.axis_names, axis_types=(AxisType.Auto,) * len(mesh.axis_names))


def _sizes(mesh) -> dict[str, int]:
    """Axis sizes of a Mesh / AbstractMesh or a {"data": d, "model": m} mapping."""
    shape = mesh if isinstance(mesh, Mapping) else dict(mesh.shape)
    if set(shape) != set(AXES):
        raise ValueError(f"mesh axes must be exactly {AXES}, got {tuple(shape)}")
    for k, v in shape.items():
        if isinstance(v, bool) or not isinstance(v, int) or v < 1:
            raise ValueError(f"mesh axis {k!r} must have a positive int size, got {v!r}")
    return {k: int(v) for k, v in shape.items()}


# ---- parameter rules ----------------------------------------------------------------------------


def _split(n: int, m: int) -> str | None:
    return MODEL if n % m == 0 else None


def _gdn_channels_split(config: ModelConfig, m: int) -> str | None:
    """w_qkv columns / conv channels / the conv window: split (contiguously) only when both the
    key and the value head counts divide, so the split-or-replicate decision matches the head
    rules. The columns are [q | k | v], so a shard holds a channel range, not (q_i, k_i, v_i):
    exact under GSPMD, and a grouped layout is future work (docs/decisions.md, "Sharding")."""
    ok = config.linear_num_key_heads % m == 0 and config.linear_num_value_heads % m == 0
    return MODEL if ok else None


def _leaf_spec(config: ModelConfig, names: tuple, shape: tuple, m: int) -> P:
    name = names[-1]
    parent = names[-2] if len(names) >= 2 else None
    hq, hkv = config.num_attention_heads, config.num_key_value_heads
    hv = config.linear_num_value_heads
    if name == "embed":
        return P(_split(shape[0], m), None)
    if name == "lm_head":
        return P(None, _split(shape[1], m))
    if parent == "attn":
        rules = {
            "w_q": P(None, _split(hq, m)),
            "w_gate": P(None, _split(hq, m)),
            "w_k": P(None, _split(hkv, m)),
            "w_v": P(None, _split(hkv, m)),
            "w_o": P(_split(hq, m), None),
        }
        return rules.get(name, P(*([None] * len(shape))))
    if parent == "gdn":
        ch = _gdn_channels_split(config, m)
        heads = _split(hv, m)
        rules = {
            "w_qkv": P(None, ch),
            "conv": P(ch, None),
            "w_z": P(None, heads),
            "w_b": P(None, heads),
            "w_a": P(None, heads),
            "A_log": P(heads),
            "dt_bias": P(heads),
            "w_out": P(heads, None),
        }
        return rules.get(name, P(*([None] * len(shape))))
    if name in ("w_gate", "w_up", "w_down"):
        if len(shape) == 3:  # MoE experts [E, ..]: expert parallel
            return P(_split(shape[0], m), None, None)
        inner = shape[1] if name != "w_down" else shape[0]
        s = _split(inner, m)
        return P(s, None) if name == "w_down" else P(None, s)
    return P(*([None] * len(shape)))  # norms, router, shared_gate, mtp fc


def _is_spec(x) -> bool:
    return isinstance(x, P)


def _is_shape(x) -> bool:
    return isinstance(x, tuple) and all(isinstance(d, int) for d in x)


def _path_names(path) -> tuple:
    return tuple(getattr(k, "key", getattr(k, "idx", None)) for k in path)


def param_specs(config: ModelConfig, mesh) -> dict:
    """PartitionSpec per parameter (same tree as ``init_params``); ``mesh`` may be a Mesh, an
    AbstractMesh or {"data": d, "model": m}."""
    m = _sizes(mesh)[MODEL]
    shapes = param_shapes(config)
    return jax.tree_util.tree_map_with_path(
        lambda path, s: _leaf_spec(config, _path_names(path), s, m), shapes, is_leaf=_is_shape
    )


def param_shardings(config: ModelConfig, mesh: Mesh) -> dict:
    mesh = check_mesh(mesh)
    return jax.tree.map(
        lambda s: NamedSharding(mesh, s),
        param_specs(config, mesh),
        is_leaf=_is_spec,
    )


def shard_params(config: ModelConfig, params: dict, mesh: Mesh) -> dict:
    """Place (or re-place) ``params`` on ``mesh`` by the rules; a leaf already placed so is kept.
    Raises ValueError when the tree or a shape does not match ``config``."""
    shardings = param_shardings(config, mesh)
    check_param_tree(config, params)
    return jax.tree.map(place, params, shardings)


def place(x, sharding: NamedSharding):
    """One leaf onto ``sharding`` (kept when already there; host data placed shard by shard, so
    on a multi-host mesh each process only places its own devices' slices)."""
    if isinstance(x, jax.Array) and x.sharding == sharding:
        return x
    if isinstance(x, jax.Array) and not x.is_fully_addressable:  # a global array: reshard
        return _resharder(sharding)(x)
    if sharding.is_fully_addressable:
        return jax.device_put(x, sharding)
    return place_host_array(np.asarray(x), sharding)


@functools.lru_cache(maxsize=256)
def _resharder(sharding: NamedSharding):
    return jax.jit(lambda a: a, out_shardings=sharding)


compiled.register(_resharder)


def batch_sharding(mesh: Mesh, ndim: int) -> NamedSharding:
    """Leading (batch) axis on ``data``, the rest unsplit: prompts, lengths, training batches,
    the loop's per-sequence buffers."""
    return NamedSharding(mesh, P(DATA, *([None] * (ndim - 1))))


def to_host(x) -> np.ndarray:
    """The whole value of a (possibly multi-host) array on this host."""
    if isinstance(x, jax.Array) and not x.is_fully_addressable and x.is_fully_replicated:
        return np.asarray(x.addressable_data(0))
    if isinstance(x, jax.Array) and not x.is_fully_addressable:
        from jax.experimental import multihost_utils

        return np.asarray(multihost_utils.process_allgather(x, tiled=True))
    return np.asarray(x)


def place_host_array(value: np.ndarray, sharding: NamedSharding) -> jax.Array:
    """Put a host array on a mesh one device shard at a time (only each device's slice is copied;
    on multi-host runs each process places only its addressable shards)."""
    value = np.asarray(value)
    return jax.make_array_from_callback(value.shape, sharding, lambda idx: value[idx])


# ---- decode state rules -------------------------------------------------------------------------


def state_specs(config: ModelConfig, batch: int, mesh) -> DecodeState:
    """PartitionSpec per decode-state leaf (a DecodeState of specs): batch on ``data`` when it
    divides, heads / channels on ``model`` exactly as the weights that write them."""
    sizes = _sizes(mesh)
    b = DATA if batch % sizes[DATA] == 0 else None
    m = sizes[MODEL]
    kv = P(b, _split(config.num_key_value_heads, m), None, None)
    gdn = GDNCache(
        state=P(b, _split(config.linear_num_value_heads, m), None, None),
        conv=P(b, None, _gdn_channels_split(config, m)),
    )
    layers = tuple(AttentionCache(kv, kv) if t == FULL else gdn for t in config.layer_types)
    mtp = AttentionCache(kv, kv) if config.mtp_num_layers else None
    return DecodeState(layers=layers, lengths=P(b), mtp=mtp, mtp_lengths=P(b))


def constrain_state(config: ModelConfig, state: DecodeState, mesh: Mesh) -> DecodeState:
    """``with_sharding_constraint`` on every state leaf (inside jit: pins the carry layout)."""
    specs = state_specs(config, state.lengths.shape[0], mesh)
    return jax.tree.map(
        lambda x, s: jax.lax.with_sharding_constraint(x, NamedSharding(mesh, s)), state, specs
    )


# ---- reports and memory -------------------------------------------------------------------------


def _shard_factor(spec: P, sizes: Mapping[str, int]) -> int:
    f = 1
    for entry in spec:
        for axis in (entry,) if isinstance(entry, str) else tuple(entry or ()):
            f *= sizes[axis]
    return f


def describe(config: ModelConfig, mesh) -> list[dict]:
    """One row per parameter leaf: path, shape, spec, and whether a shardable (≥ 2-D) leaf ended
    up replicated on ``model`` because a head / expert / hidden count does not divide."""
    sizes = _sizes(mesh)
    shapes = param_shapes(config)
    specs = param_specs(config, sizes)
    rows = []
    for (path, shape), spec in zip(
        jax.tree_util.tree_flatten_with_path(shapes, is_leaf=_is_shape)[0],
        jax.tree.leaves(specs, is_leaf=_is_spec),
        strict=True,
    ):
        names = _path_names(path)
        sharded = _shard_factor(spec, sizes) > 1
        expect = len(shape) >= 2 and names[-1] not in ("router", "shared_gate", "fc")
        rows.append(
            {
                "path": jax.tree_util.keystr(path),
                "shape": shape,
                "spec": spec,
                "replicated_on_model": expect and not sharded and sizes[MODEL] > 1,
            }
        )
    return rows


def memory_estimate(
    config: ModelConfig,
    mesh,
    *,
    batch: int,
    capacity: int,
    param_dtype: str | None = None,
    train: bool = False,
) -> dict:
    """Bytes per device: inference = parameters + the decode state (``batch`` sequences of
    ``capacity`` tokens); ``train=True`` = parameters + AdamW's two moments + gradients, in the
    parameter dtype as ``make_optimizer`` holds them (the total then leaves the decode state
    out). Exact for the arrays mtpspec holds (same rules as the real placement); activations and
    XLA temporaries are not included (see ``compiled.memory_analysis()`` for a real program)."""
    sizes = _sizes(mesh)
    if param_dtype is not None:
        config = dataclasses.replace(config, dtype=jax.numpy.dtype(param_dtype).name)
    pdtype = np.dtype(jax.numpy.dtype(config.dtype))
    shapes = param_shapes(config)
    specs = param_specs(config, sizes)
    leaves = jax.tree.leaves(shapes, is_leaf=_is_shape)
    spec_leaves = jax.tree.leaves(specs, is_leaf=_is_spec)
    param_elems = sum(
        math.prod(s) / _shard_factor(p, sizes) for s, p in zip(leaves, spec_leaves, strict=True)
    )
    total_params = sum(math.prod(s) for s in leaves)
    state = jax.eval_shape(lambda: init_decode_state(config, batch, capacity))
    state_bytes = sum(
        math.prod(x.shape) * np.dtype(x.dtype).itemsize / _shard_factor(p, sizes)
        for x, p in zip(
            jax.tree.leaves(state),
            jax.tree.leaves(state_specs(config, batch, sizes), is_leaf=_is_spec),
            strict=True,
        )
    )
    out = {
        "mesh": dict(sizes),
        "devices": sizes[DATA] * sizes[MODEL],
        "total_params": int(total_params),
        "param_bytes_per_device": int(param_elems * pdtype.itemsize),
        "state_bytes_per_device": int(state_bytes),
        "batch": batch,
        "capacity": capacity,
        "replicated_on_model": [
            r["path"] for r in describe(config, sizes) if r["replicated_on_model"]
        ],
    }
    if train:  # no decode state: params + AdamW mu, nu + gradients, all in the param dtype
        # (optax.adamw without mu_dtype keeps the moments in the params' dtype; no f32 master)
        out["optimizer_bytes_per_device"] = int(param_elems * pdtype.itemsize * 2)
        out["grad_bytes_per_device"] = int(param_elems * pdtype.itemsize)
        parts = ("param", "optimizer", "grad")
    else:
        parts = ("param", "state")
    out["total_bytes_per_device"] = sum(out[f"{p}_bytes_per_device"] for p in parts)
    return out
