"""Reading safetensors checkpoints: a directory's tensor index (single file or sharded with an
index), each tensor's header shape and dtype, and opening a file with errors that name it."""

from __future__ import annotations

import json
import os
from collections.abc import Sequence

from safetensors import safe_open

SINGLE_FILE = "model.safetensors"
INDEX_FILE = "model.safetensors.index.json"


def open_file(file: str):
    try:
        return safe_open(file, framework="flax")
    except FileNotFoundError as e:
        raise OSError(f"safetensors file {file} does not exist") from e
    except Exception as e:  # SafetensorError etc: truncated / corrupt header
        raise OSError(f"cannot read safetensors file {file}: {e}") from e


def index_tensors(path: str) -> dict[str, str]:
    """name -> file, for a single-file or sharded checkpoint; checks every file opens."""
    single = os.path.join(path, SINGLE_FILE)
    index = os.path.join(path, INDEX_FILE)
    if os.path.isfile(single):
        files, promised = [single], {}
    elif os.path.isfile(index):
        try:
            with open(index) as f:
                weight_map = json.load(f)["weight_map"]
            if not isinstance(weight_map, dict):
                raise TypeError("weight_map is not an object")
        except (json.JSONDecodeError, KeyError, TypeError) as e:
            raise ValueError(f"bad safetensors index {index}: {e!r}") from e
        for k, v in weight_map.items():  # a shard is a file of this directory, nothing else
            if not isinstance(v, str) or v != os.path.basename(v) or v in ("", ".", ".."):
                raise ValueError(
                    f"safetensors index {index} maps {k} to {v!r}: shards must be file names "
                    "in the checkpoint's own directory"
                )
        promised = {k: os.path.join(path, v) for k, v in weight_map.items()}
        files = sorted(set(promised.values()))
        for file in files:
            if not os.path.isfile(file):
                raise OSError(f"shard {file} named in {index} does not exist")
    else:
        raise OSError(f"no weights in {path}: expected {SINGLE_FILE} or {INDEX_FILE}")

    where: dict[str, str] = {}
    for file in files:
        with open_file(file) as f:
            for name in f.keys():
                if name in where:
                    raise ValueError(f"tensor {name} is in both {where[name]} and {file}")
                where[name] = file
    for name, file in promised.items():
        if where.get(name) != file:
            raise ValueError(f"index {index} maps tensor {name} to {file}, which lacks it")
    return where


# safetensors dtype codes of floating-point tensors (weights); integer / bool tensors are refused
FLOAT_DTYPES = ("F64", "F32", "F16", "BF16", "F8_E4M3", "F8_E5M2")


def tensor_shapes(where: dict[str, str], names: Sequence[str]) -> dict[str, tuple[int, ...]]:
    """name -> shape from the files' headers; a tensor that is not floating point is a
    TypeError (casting integers or booleans to weights would be silent garbage)."""
    by_file: dict[str, list[str]] = {}
    for n in names:
        by_file.setdefault(where[n], []).append(n)
    out = {}
    for file, ns in by_file.items():
        with open_file(file) as f:
            for n in ns:
                sl = f.get_slice(n)
                if str(sl.get_dtype()) not in FLOAT_DTYPES:
                    raise TypeError(
                        f"tensor {n} in {file} has dtype {sl.get_dtype()}; weights must be "
                        f"floating point ({', '.join(FLOAT_DTYPES)})"
                    )
                out[n] = tuple(sl.get_shape())
    return out
