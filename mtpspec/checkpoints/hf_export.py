"""Export the canonical parameter tree as an HF Qwen3-Next / Qwen3.5 checkpoint (``save_hf``).

The output is exactly what ``load_hf`` reads and what transformers' ``Qwen3NextForCausalLM`` /
``Qwen3_5ForCausalLM`` load (``tests/fixtures/HF_NOTES.md`` has the layouts):

* ``config.json`` in transformers 5.x style (``layer_types``, ``rope_parameters``), with the MTP
  depth key of the family (Qwen3.5: ``mtp_num_hidden_layers``; Qwen3-Next: vLLM's
  ``num_nextn_predict_layers``). It is built first and read back through ``from_hf_config``:
  a config whose read-back differs in any field (something the family cannot express) is a
  ``ValueError`` naming the fields, raised before any file is written.
* ``model.safetensors``, or ``model-0000i-of-0000n.safetensors`` shards plus
  ``model.safetensors.index.json`` when the tensors exceed ``max_shard_bytes``. The tensor
  mapping is the inverse half of ``load_hf``'s own spec table (``hf.TensorSpec.inv``): Qwen3-Next's
  ``in_proj_qkvz`` / ``in_proj_ba`` interleaved per key-head group, Qwen3.5's split
  ``in_proj_qkv`` / ``in_proj_z`` / ``in_proj_a`` / ``in_proj_b``, attention ``q_proj`` with
  query and gate rows interleaved per head, Linear weights [out, in], (1 + w) norms stored
  as-is (HF applies ``1 + w`` itself), the GDN output norm a plain weight, MoE experts as
  per-expert tensors (what HF's ``save_pretrained`` and every released checkpoint use), and
  ``mtp.*`` at the top level. Tied models write no ``lm_head.weight``.
* optionally the tokenizer: ``tokenizer.json`` + ``tokenizer_config.json`` (a real tokenizer's own,
  chat template and special tokens included; ``chat_template.jinja`` when it came as one); for
  the byte-level tokenizer a faithful ``tokenizers``-format equivalent
  (``tokenizers.byte_tokenizer_json``).
* ``generation_config.json`` with the EOS ids (a list) when there are any (``eos_token_id``, else
  the tokenizer's), and ``eos_token_id`` in config.json (the first of them).

The safetensors files are written by this module directly from the format's specification
(8-byte little-endian header length, JSON header, contiguous data), so the output does not
depend on which ``safetensors`` version is installed; ``load_hf`` reads them with the library.
"""

from __future__ import annotations

import dataclasses
import json
import os
import pathlib
import shutil
import struct

import jax
import numpy as np

from mtpspec.checkpoints.hf import INDEX_FILE, SINGLE_FILE, model_specs
from mtpspec.checkpoints.hf_config import DEFAULT_MAX_POSITION_EMBEDDINGS, hf_config_dict
from mtpspec.config import ModelConfig, check_dtype, token_id_list
from mtpspec.models.params import check_param_tree
from mtpspec.tokenizers import ByteTokenizer, HFTokenizer, byte_tokenizer_json

# HF's save_pretrained default in transformers 4.x (the released Qwen repos use ~4-5 GB shards).
DEFAULT_MAX_SHARD_BYTES = 5_000_000_000
_ST_DTYPE = {"float32": "F32", "bfloat16": "BF16"}
TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "chat_template.jinja")
GENERATION_CONFIG = "generation_config.json"
LAYOUTS = ("causal_lm", "conditional_generation")


# --------------------------------------------------------------------------------------------
# tensors


def _get(tree, path: tuple):
    for key in path:
        tree = tree[key]
    return tree


def hf_tensors(config: ModelConfig, params: dict, *, dtype: str | None = None) -> dict:
    """HF tensor name -> numpy array (``dtype``, default the config's), in ``config.family``'s
    layout; the inverse of ``load_hf``'s mapping. Pure. ``params`` must match
    ``param_shapes(config)`` exactly (ValueError naming the leaf otherwise)."""
    dtype = check_dtype(config.dtype if dtype is None else dtype)
    check_param_tree(config, params)
    out_dtype = np.dtype(jax.numpy.dtype(dtype))
    out: dict[str, np.ndarray] = {}
    # names=set(): per-expert MoE tensors, the on-disk layout of the family's HF code.
    for spec in model_specs(config, "model.", set()):
        leaves = [np.asarray(jax.device_get(_get(params, p))) for p in spec.outs]
        tensors = spec.inv(*leaves)
        for name, shape, t in zip(spec.names, spec.shapes, tensors, strict=True):
            if tuple(t.shape) != shape:  # a bug in an inverse, never user input
                raise AssertionError(f"export of {name} has shape {t.shape}, expected {shape}")
            out[name] = np.ascontiguousarray(t.astype(out_dtype))
    return out


def _write_safetensors(file: pathlib.Path, tensors: dict, metadata: dict) -> None:
    """One safetensors file, tensors in sorted name order (deterministic bytes)."""
    header: dict = {"__metadata__": metadata}
    offset = 0
    for name in sorted(tensors):
        t = tensors[name]
        n = t.nbytes
        header[name] = {
            "dtype": _ST_DTYPE[t.dtype.name],
            "shape": list(t.shape),
            "data_offsets": [offset, offset + n],
        }
        offset += n
    blob = json.dumps(header, separators=(",", ":")).encode()
    blob += b" " * (-len(blob) % 8)  # pad the header to 8-byte alignment, as the writer does
    with open(file, "wb") as f:
        f.write(struct.pack("<Q", len(blob)))
        f.write(blob)
        for name in sorted(tensors):
            t = tensors[name]
            t = np.ascontiguousarray(t.astype(t.dtype.newbyteorder("<"), copy=False))
            f.write(t.reshape(-1).view(np.uint8).data)  # no extra copy on little-endian hosts


def _shards(tensors: dict, max_shard_bytes: int) -> list[list[str]]:
    """Names grouped into shards in sorted order, each at most max_shard_bytes (a tensor larger
    than that gets a shard of its own)."""
    shards: list[list[str]] = [[]]
    size = 0
    for name in sorted(tensors):
        n = tensors[name].nbytes
        if shards[-1] and size + n > max_shard_bytes:
            shards.append([])
            size = 0
        shards[-1].append(name)
        size += n
    return shards


# --------------------------------------------------------------------------------------------
# tokenizer


def _tokenizer_files(tokenizer, config: ModelConfig) -> dict[str, str] | None:
    """file name -> text for the tokenizer, validated against the vocabulary."""
    if tokenizer is None:
        return None
    tok_path = False
    extra = {}
    if isinstance(tokenizer, ByteTokenizer):
        text = json.dumps(byte_tokenizer_json(), ensure_ascii=False, indent=2) + "\n"
        size = tokenizer.vocab_size
    elif isinstance(tokenizer, HFTokenizer):
        text = tokenizer.to_json()
        size = tokenizer.vocab_size
        src, tok_path = tokenizer.directory / "tokenizer.json", True
    elif isinstance(tokenizer, str | os.PathLike):
        src = pathlib.Path(tokenizer)
        if src.is_dir():
            src = src / "tokenizer.json"
        if not src.is_file():
            raise OSError(f"no tokenizer.json at {src}")
        text = src.read_text()
        tok_path = True
        try:
            data = json.loads(text)
            vocab = data["model"]["vocab"]
            ids = vocab.values() if isinstance(vocab, dict) else range(len(vocab))
            added = [t["id"] for t in data.get("added_tokens", [])]
            size = max([*ids, *added], default=-1) + 1
        except (json.JSONDecodeError, KeyError, TypeError, AttributeError) as e:
            raise ValueError(f"{src} is not a tokenizers-format tokenizer.json: {e!r}") from e
    else:
        raise TypeError(
            "tokenizer must be None, a ByteTokenizer, an HFTokenizer or a path to a "
            f"tokenizer.json, got {type(tokenizer).__name__}"
        )
    if size > config.vocab_size:
        raise ValueError(
            f"the tokenizer has {size} ids but the model's vocab_size is {config.vocab_size}"
        )
    beside = src.parent / "tokenizer_config.json" if tok_path else None
    if beside is not None and beside.is_file():  # keep a real tokenizer's special tokens etc.
        tok_config_text = beside.read_text()
        template = src.parent / "chat_template.jinja"
        if template.is_file():
            extra["chat_template.jinja"] = template.read_text()
    else:  # the generic fast tokenizer over tokenizer.json, no text clean-up (exact bytes)
        tok_config = {
            "clean_up_tokenization_spaces": False,
            "tokenizer_class": "PreTrainedTokenizerFast",
        }
        if getattr(tokenizer, "chat_template", None):
            tok_config["chat_template"] = tokenizer.chat_template
        tok_config_text = json.dumps(tok_config, ensure_ascii=False, indent=2) + "\n"
    return {"tokenizer.json": text, "tokenizer_config.json": tok_config_text, **extra}


def _eos_list(eos_token_id, tokenizer, config: ModelConfig) -> list[int]:
    """The EOS ids to record: ``eos_token_id`` (an int or ints), else the tokenizer's; checked as
    decoding checks ``eos_id`` (``config.token_id_list``: ValueError naming the problem)."""
    if eos_token_id is None and tokenizer is not None:
        ids = list(getattr(tokenizer, "eos_token_ids", ()))
        return token_id_list(config, ids, "the tokenizer's EOS ids")
    return token_id_list(config, eos_token_id, "eos_token_id")


# --------------------------------------------------------------------------------------------
# save_hf


def _our_files(path: pathlib.Path) -> list[pathlib.Path]:
    """Files in ``path`` that an earlier export may have written (removed on overwrite)."""
    pats = (
        "config.json",
        SINGLE_FILE,
        INDEX_FILE,
        "model-*-of-*.safetensors",
        *TOKENIZER_FILES,
        GENERATION_CONFIG,
    )
    return sorted({f for pat in pats for f in path.glob(pat) if f.is_file()})


def save_hf(
    config: ModelConfig,
    params: dict,
    path: str | os.PathLike,
    *,
    family: str | None = None,
    dtype: str | None = None,
    max_shard_bytes: int = DEFAULT_MAX_SHARD_BYTES,
    tokenizer=None,
    eos_token_id=None,
    generation_config: dict | None = None,
    max_position_embeddings: int = DEFAULT_MAX_POSITION_EMBEDDINGS,
    overwrite: bool = False,
    layout: str = "causal_lm",
) -> list[str]:
    """Write ``(config, params)`` as an HF checkpoint directory that ``load_hf`` and transformers
    read; returns the written file names.

    family: "qwen3_5" | "qwen3_next" (default ``config.family``). A dense model can be written
      as either; the parameter tree is the same, only the projection layout and config differ.
    dtype: "float32" | "bfloat16" storage dtype (default ``config.dtype``); ``config.json``
      records it, so ``load_hf(path)`` returns ``replace(config, family=family, dtype=dtype)``
      and params equal to ``params`` cast to ``dtype``, bit for bit.
    max_shard_bytes: above this total the tensors go to numbered shards + an index.
    tokenizer: None, ``tokenizers.ByteTokenizer()`` (writes a byte-level ``tokenizer.json``),
      an ``HFTokenizer`` (its files, chat template included), or a path to a ``tokenizer.json``
      (copied, with the ``tokenizer_config.json`` / ``chat_template.jinja`` beside it).
    eos_token_id: an int or a list of ints (default: the tokenizer's ``eos_token_ids``); written
      to ``generation_config.json`` (the list) and config.json (the first).
    generation_config: further ``generation_config.json`` entries (e.g. sampling defaults).
    layout: "causal_lm" (``model.*`` weights, a flat config: ``Qwen3_5ForCausalLM`` /
      ``Qwen3NextForCausalLM``) or "conditional_generation", the layout of the released Qwen3.5
      repos (``Qwen3_5ForConditionalGeneration``: the text config nested as ``text_config``, the
      text weights under ``model.language_model.*``, ``mtp.*`` and ``lm_head.weight`` at the top;
      no vision tower is written). Qwen3.5 only.
    overwrite: ``path`` must otherwise be absent or an empty directory; with ``overwrite`` the
      files an earlier export wrote there (config, weights, index, shards, tokenizer) are
      replaced. The new files are written beside ``path`` (``<path>.saving``) and moved in only
      once complete, so a failed save leaves the earlier checkpoint as it was.

    Every argument, the config/family combination, the parameter tree and the destination are
    checked before anything is written (ValueError / TypeError / OSError naming the problem).
    """
    cfg_dict = hf_config_dict(
        config, family=family, dtype=dtype, max_position_embeddings=max_position_embeddings
    )
    family = config.family if family is None else family
    dtype = config.dtype if dtype is None else dtype
    if layout not in LAYOUTS:
        raise ValueError(f"unknown layout {layout!r}; expected one of {LAYOUTS}")
    if layout == "conditional_generation" and family != "qwen3_5":
        raise ValueError(f"layout='conditional_generation' is Qwen3.5's; the family is {family!r}")
    if isinstance(max_shard_bytes, bool) or not isinstance(max_shard_bytes, int):
        raise TypeError(f"max_shard_bytes must be an int, got {type(max_shard_bytes).__name__}")
    if max_shard_bytes < 1:
        raise ValueError(f"max_shard_bytes must be positive, got {max_shard_bytes}")
    out_config = dataclasses.replace(config, family=family, dtype=dtype)
    tensors = hf_tensors(out_config, params, dtype=dtype)
    tok_files = _tokenizer_files(tokenizer, config)
    eos = _eos_list(eos_token_id, tokenizer, config)
    if generation_config is not None and not isinstance(generation_config, dict):
        raise TypeError(
            f"generation_config must be a dict or None, got {type(generation_config).__name__}"
        )
    gen = dict(generation_config or {})
    if eos:
        cfg_dict["eos_token_id"] = eos[0]
        gen["eos_token_id"] = eos if len(eos) > 1 else eos[0]
    if layout == "conditional_generation":
        cfg_dict, tensors = _conditional_generation(cfg_dict, tensors)
    if gen:
        tok_files = dict(tok_files or {})
        tok_files[GENERATION_CONFIG] = json.dumps(gen, indent=2) + "\n"

    path = pathlib.Path(path)
    if path.exists():
        if not path.is_dir():
            raise OSError(f"{path} exists and is not a directory")
        stale = _our_files(path)
        others = sorted(set(path.iterdir()) - set(stale))
        if others and not overwrite:
            raise FileExistsError(f"{path} is not empty ({others[0].name}, ...)")
        if stale and not overwrite:
            raise FileExistsError(f"{path} already holds a checkpoint (pass overwrite=True)")
    # Written beside ``path`` first, moved in once complete: a failed write (disk full, a crash,
    # an exception) leaves an earlier checkpoint at ``path`` as it was.
    staging = path.with_name(path.name + ".saving")
    shutil.rmtree(staging, ignore_errors=True)
    staging.mkdir(parents=True)
    try:
        written = _write_files(staging, tensors, max_shard_bytes, tok_files, cfg_dict)
    except BaseException:
        shutil.rmtree(staging, ignore_errors=True)
        raise
    _move_in(staging, path, written)
    return written


def _conditional_generation(text: dict, tensors: dict) -> tuple[dict, dict]:
    """A text model's config and tensors in the released Qwen3.5 wrapper's layout."""
    top = {
        "architectures": ["Qwen3_5ForConditionalGeneration"],
        "model_type": "qwen3_5",
        "dtype": text["dtype"],
        "tie_word_embeddings": text["tie_word_embeddings"],
        "text_config": text,
    }
    if text.get("eos_token_id") is not None:
        top["eos_token_id"] = text["eos_token_id"]
    inner = "model.language_model."
    renamed = {
        (inner + k[len("model.") :] if k.startswith("model.") else k): v for k, v in tensors.items()
    }
    return top, renamed


def _write_files(path: pathlib.Path, tensors, max_shard_bytes, tok_files, cfg_dict) -> list[str]:
    written = []
    metadata = {"format": "pt"}  # what transformers expects of a PyTorch-loadable file
    shards = _shards(tensors, max_shard_bytes)
    if len(shards) == 1:
        _write_safetensors(path / SINGLE_FILE, tensors, metadata)
        written.append(SINGLE_FILE)
    else:
        weight_map = {}
        for i, names in enumerate(shards):
            fname = f"model-{i + 1:05d}-of-{len(shards):05d}.safetensors"
            _write_safetensors(path / fname, {n: tensors[n] for n in names}, metadata)
            weight_map.update({n: fname for n in names})
            written.append(fname)
        index = {
            "metadata": {"total_size": sum(t.nbytes for t in tensors.values())},
            "weight_map": dict(sorted(weight_map.items())),
        }
        (path / INDEX_FILE).write_text(json.dumps(index, indent=2) + "\n")
        written.append(INDEX_FILE)
    for fname, text in (tok_files or {}).items():
        (path / fname).write_text(text)
        written.append(fname)
    (path / "config.json").write_text(json.dumps(cfg_dict, indent=2) + "\n")
    written.append("config.json")
    return written


def _move_in(staging: pathlib.Path, path: pathlib.Path, written: list[str]) -> None:
    """Replace an earlier export's files in ``path`` by the complete new set in ``staging``:
    old files aside first, new ones in (config.json last: a directory whose move was interrupted
    does not look like a checkpoint), then the old ones deleted."""
    path.mkdir(parents=True, exist_ok=True)
    replaced = path.with_name(path.name + ".replaced")
    shutil.rmtree(replaced, ignore_errors=True)
    replaced.mkdir()
    for f in _our_files(path):
        f.rename(replaced / f.name)
    for name in sorted(written, key=lambda n: n == "config.json"):
        (staging / name).rename(path / name)
    shutil.rmtree(staging, ignore_errors=True)
    shutil.rmtree(replaced, ignore_errors=True)
