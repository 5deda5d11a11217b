"""Host-side preparation of a decoding call: argument checks (before any device work), length
buckets, the KV capacity formula, the program key, and placing the arguments on the device(s)."""

from __future__ import annotations

import functools
import math
import numbers
import os
from collections.abc import Sequence
from typing import NamedTuple

import jax
import jax.numpy as jnp
import numpy as np
from jax.sharding import NamedSharding
from jax.sharding import PartitionSpec as P

from mtpspec import sharding
from mtpspec.config import ModelConfig, token_id_list
from mtpspec.decoding import proposers
from mtpspec.decoding.adaptive import DraftLimits
from mtpspec.decoding.backend import resolve as resolve_backend
from mtpspec.decoding.program import ProgramKey
from mtpspec.decoding.sampling import (
    Draws,
    Knobs,
    Sampling,
    check_seeds,
    knobs_for,
    pad_knobs,
    seed_keys,
)
from mtpspec.decoding.spec import DEFAULT_COMMIT, SpecConfig
from mtpspec.models import inference
from mtpspec.models.inference import resolve_linear
from mtpspec.models.params import check_param_tree
from mtpspec.models.state import init_decode_state
from mtpspec.models.tree import check_tree
from mtpspec.sharding import DATA

BUCKET = 16  # prompt lengths and max_new_tokens are padded to multiples of this


def round_up(x: int, m: int) -> int:
    return -(-x // m) * m


def default_capacity(longest_prompt: int, max_new_tokens: int, num_draft: int) -> int:
    """KV slots per sequence that ``generate`` allocates when not told: the prompt bucket, the
    output bucket and one verify window (k + 1 rows; for a tree pass its rows − 1) of room."""
    return (
        round_up(longest_prompt, BUCKET) + round_up(max(max_new_tokens, 1), BUCKET) + num_draft + 1
    )


def check_prompts(config: ModelConfig, prompts) -> list[list[int]]:
    if isinstance(prompts, np.ndarray | jax.Array):
        raise TypeError("prompts must be a list of token-id lists (ragged batch), not an array")
    if not isinstance(prompts, Sequence) or isinstance(prompts, str) or not prompts:
        raise ValueError("prompts must be a non-empty list of token-id lists")
    out = []
    for i, p in enumerate(prompts):
        if not isinstance(p, Sequence) or isinstance(p, str):
            raise TypeError(f"prompt {i} must be a list of ints, got {type(p).__name__}")
        if len(p) == 0:
            raise ValueError(f"prompt {i} is empty")
        for t in p:
            if isinstance(t, bool) or not isinstance(t, int | np.integer):
                raise TypeError(f"prompt {i} holds a non-integer token {t!r}")
            if not 0 <= int(t) < config.vocab_size:
                raise ValueError(
                    f"prompt {i} holds token {int(t)} outside the vocabulary "
                    f"[0, {config.vocab_size})"
                )
        out.append([int(t) for t in p])
    return out


class HostArrays(NamedTuple):
    tokens: np.ndarray  # [b, p_pad] int32 right-padded prompts (b padded to the data axis)
    lengths: np.ndarray  # [b] int32
    max_new: np.ndarray  # [b] int32
    eos: np.ndarray  # [E] int32 stop ids (−1 pads; E a multiple of EOS_SLOTS)
    knobs: Knobs  # [b] per-row sampling settings
    seeds: list[int]  # [b] one seed per row
    p_min: float = 0.0  # the call's draft confidence cut (``SpecConfig.p_min``)
    adaptive: bool = False  # the per-sequence draft-length policy (``SpecConfig.adaptive``)


EOS_SLOTS = 8  # EOS lists are padded to a multiple of this (one compile per bucket)


def check_eos(config: ModelConfig, eos_id) -> list[int]:
    """None, one id or a sequence of ids, each in the vocabulary, as a list (duplicates
    removed); ValueError naming the problem otherwise (``config.token_id_list``)."""
    return token_id_list(config, eos_id, "eos_id")


def _check_call(config, params, max_new_tokens, speculative) -> None:
    if not isinstance(config, ModelConfig):
        raise TypeError(f"config must be a ModelConfig, got {type(config).__name__}")
    if not isinstance(params, inference.DecodingWeights):
        check_param_tree(config, params, allow_missing_mtp=True)
    if isinstance(max_new_tokens, bool) or not isinstance(max_new_tokens, numbers.Integral):
        raise TypeError(f"max_new_tokens must be an int, got {type(max_new_tokens).__name__}")
    if max_new_tokens < 0:
        raise ValueError(f"max_new_tokens must be >= 0, got {max_new_tokens}")
    if max_new_tokens > MAX_POSITIONS:
        raise ValueError(
            f"max_new_tokens {max_new_tokens} exceeds the int32 positions this decoder uses "
            f"(at most {MAX_POSITIONS} tokens per sequence)"
        )
    if speculative is not None and not isinstance(speculative, SpecConfig):
        raise TypeError(
            f"speculative must be None or a SpecConfig, got {type(speculative).__name__}"
        )
    if speculative is not None:
        speculative.validate(config, params)


MAX_POSITIONS = 2**31 - 1 - 2 * BUCKET  # int32 positions, with room for padding and a window
MEMORY_FRACTION = 0.8  # refuse a call whose decode buffers alone need more than this


def available_memory_bytes() -> int | None:
    """The default device's memory limit (accelerators) or this machine's RAM (CPU); None if
    unknown."""
    device = jax.devices()[0]
    stats = device.memory_stats() if hasattr(device, "memory_stats") else None
    if stats and stats.get("bytes_limit"):
        return int(stats["bytes_limit"])
    try:
        return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    except (ValueError, OSError, AttributeError):
        return None


@functools.lru_cache(maxsize=64)
def _state_bytes(config, batch: int, capacity: int) -> int:
    shapes = jax.eval_shape(lambda: init_decode_state(config, batch, capacity))
    return sum(math.prod(x.shape) * x.dtype.itemsize for x in jax.tree.leaves(shapes))


def check_memory(config, batch: int, capacity: int, out_size: int, mesh) -> None:
    """ValueError before any device work when the decode state and output buffers of a call
    cannot fit (a huge max_new_tokens or capacity would otherwise die in XLA's allocator)."""
    if capacity > MAX_POSITIONS:
        raise ValueError(f"capacity {capacity} exceeds the int32 positions ({MAX_POSITIONS})")
    need = _state_bytes(config, batch, capacity) + 2 * batch * out_size * 4  # + out, accepts
    devices = 1 if mesh is None else mesh.size
    have = available_memory_bytes()
    if have is not None and need > MEMORY_FRACTION * have * devices:
        raise ValueError(
            f"this call needs {need / 2**30:.1f} GiB for its decode state and output buffers "
            f"(batch {batch}, capacity {capacity} tokens, {out_size} output slots), more than "
            f"{MEMORY_FRACTION:.0%} of the {have * devices / 2**30:.1f} GiB available; lower "
            "max_new_tokens, capacity or the batch"
        )


def _check_capacity_arg(capacity, longest: int) -> int:
    if isinstance(capacity, bool) or not isinstance(capacity, int):
        raise TypeError(f"capacity must be an int, got {type(capacity).__name__}")
    if capacity < longest + 1:
        raise ValueError(
            f"capacity {capacity} cannot hold the longest prompt ({longest} tokens) plus one "
            "generated token"
        )
    return capacity


def prepare(
    config,
    params,
    prompts,
    max_new_tokens,
    speculative,
    sampling: dict,
    eos_id,
    mesh,
    capacity,
    linear="auto",
    logprobs=False,
    attention="auto",
) -> tuple[ProgramKey, HostArrays]:
    """Every check, then (program key, host arrays). ``sampling``: temperature, top_k, top_p,
    min_p (each one value or one per prompt) and seed. Raises ValueError / TypeError before any
    device work."""
    _check_call(config, params, max_new_tokens, speculative)
    prompts = check_prompts(config, prompts)
    eos_ids = check_eos(config, eos_id)
    if not isinstance(logprobs, bool):
        raise TypeError(f"return_logprobs must be a bool, got {type(logprobs).__name__}")
    sampling = dict(sampling)
    seeds = check_seeds(sampling.pop("seed"), len(prompts))
    knobs, greedy = knobs_for(len(prompts), **sampling)
    k = speculative.num_draft if speculative else 0
    tree = check_tree(speculative.tree) if speculative and speculative.tree is not None else None
    rows = tree.rows if tree is not None else k + 1  # KV slots one verify window writes
    longest = max(len(p) for p in prompts)
    p_pad = round_up(longest, BUCKET)
    if mesh is not None:
        mesh = sharding.check_mesh(mesh)
    sharded = mesh is not None
    if isinstance(params, inference.DecodingWeights):
        linear = params.check_call(config, linear, mesh)
    else:
        linear = resolve_linear(linear, sharded=sharded)
    config = inference.compute_config(config, linear)
    backend = resolve_backend(
        config,
        linear=linear,
        attention=attention,
        verify_method=speculative.verify_method if speculative else "auto",
        window=k + 1,
        prefill=p_pad,
        sharded=sharded,
    )
    key = ProgramKey(
        config=config,
        k=k,
        proposer=proposers.lookup(speculative.proposer).from_spec(speculative) if k else None,
        commit=speculative.commit if speculative else DEFAULT_COMMIT,
        sampling=Sampling(greedy=greedy),
        capacity=default_capacity(longest, max_new_tokens, rows - 1)
        if capacity is None
        else _check_capacity_arg(capacity, longest),
        out_size=round_up(max(max_new_tokens, 1), BUCKET),
        mesh=mesh,
        backend=backend,
        logprobs=logprobs,
        tree=tree,
        adaptive=bool(speculative and speculative.adapts),
    )
    b = len(prompts)
    check_memory(config, b, key.capacity, key.out_size, mesh)
    if mesh is not None:  # pad the batch to a multiple of the data axis with 1-token dummies
        b = round_up(b, mesh.shape[DATA])
    tokens = np.zeros((b, p_pad), np.int32)
    for i, p in enumerate(prompts):
        tokens[i, : len(p)] = p
    lengths = np.ones((b,), np.int32)
    lengths[: len(prompts)] = [len(p) for p in prompts]
    max_new = np.ones((b,), np.int32)  # a dummy row stops right after its prefill token
    max_new[: len(prompts)] = max_new_tokens
    eos = np.full(round_up(max(len(eos_ids), 1), EOS_SLOTS), -1, np.int32)
    eos[: len(eos_ids)] = eos_ids
    seeds = seeds + [0] * (b - len(seeds))
    p_min = float(speculative.p_min) if speculative else 0.0
    policy = bool(speculative and speculative.adaptive)
    arrays = HostArrays(tokens, lengths, max_new, eos, pad_knobs(knobs, b), seeds, p_min, policy)
    return key, arrays


def device_args(s: ProgramKey, params, pparams, arrays: HostArrays) -> tuple:
    """(params, pparams, tokens, lengths, max_new, eos, draws, limits) on the device(s): under a
    mesh the
    weights are placed by the sharding rules (already-placed leaves are kept) and the
    per-sequence arrays split on ``data``."""
    keys = seed_keys(arrays.seeds)
    limits = DraftLimits(np.float32(arrays.p_min), np.bool_(arrays.adaptive))
    if s.mesh is None:  # the inference tree: fused projections, packed for the C++ linear
        params = inference.MEMO.get(s.config, params, s.backend.linear, s.backend.attention)
        draws = Draws(keys, Knobs(*(jnp.asarray(x) for x in arrays.knobs)))
        plain = (arrays.tokens, arrays.lengths, arrays.max_new, arrays.eos)
        limits = DraftLimits(*(jnp.asarray(x) for x in limits))
        return (params, pparams, *(jnp.asarray(a) for a in plain), draws, limits)
    mesh = s.mesh
    params = sharding.shard_params(s.config, params, mesh)
    if pparams is not None:
        pparams = s.proposer.shard_params(pparams, mesh)

    def rows(x):
        return sharding.place_host_array(x, sharding.batch_sharding(mesh, x.ndim))

    replicated = NamedSharding(mesh, P())
    key_data = np.asarray(jax.random.key_data(keys))
    draws = Draws(jax.random.wrap_key_data(rows(key_data)), Knobs(*(rows(x) for x in arrays.knobs)))
    return (
        params,
        pparams,
        rows(arrays.tokens),
        rows(arrays.lengths),
        rows(arrays.max_new),
        sharding.place_host_array(np.asarray(arrays.eos), replicated),
        draws,
        DraftLimits(*(sharding.place_host_array(np.asarray(x), replicated) for x in limits)),
    )
