"""Checkpoints: HF safetensors import (``load_hf``) and export (``save_hf``), the HF config mapping
both ways (``from_hf_config`` / ``hf_config_dict``), and orbax save / restore of the param tree."""

import pathlib

from mtpspec import compiled
from mtpspec.checkpoints.hf import load_hf
from mtpspec.checkpoints.hf_config import from_hf_config, hf_config_dict
from mtpspec.checkpoints.hf_export import save_hf
from mtpspec.checkpoints.orbax_io import restore_params, save_params

__all__ = [
    "from_hf_config",
    "hf_config_dict",
    "load_hf",
    "restore_params",
    "save_hf",
    "save_params",
]


_OWN = object()  # load's dtype default: float32, or the checkpoint's own when for_decoding


def load(
    path,
    *,
    mesh=None,
    dtype=_OWN,
    allow_missing_mtp: bool = False,
    for_decoding: bool = False,
    linear: str = "auto",
    weights: str = "stored",
    greedy_head: str = "auto",
):
    """An mtpspec checkpoint (``save_params``: config.json + params/) or an HF directory
    (config.json + safetensors). ``dtype``: "float32" | "bfloat16" (``config.DTYPES``; a NumPy /
    JAX dtype naming one is accepted) casts every floating-point weight on load, for either
    kind; None keeps the checkpoint's own; anything else is a ValueError naming it, before any
    read. Default: "float32", or with ``for_decoding`` the checkpoint's own (a bf16 checkpoint
    decodes from bf16 matrices on the C++ linear, in float32 arithmetic). ``allow_missing_mtp``:
    an HF config that declares MTP layers whose ``mtp.*`` tensors are absent loads without them,
    as ``load_hf``. Returns (config, params), ``config.dtype`` the params' dtype; with ``mesh``
    the params are placed shard by shard by the ``mtpspec.sharding`` rules.

    ``for_decoding=True`` returns (config, ``DecodingWeights``) instead: the weights in the
    layout decoding runs on (fused, packed for ``linear``'s implementation, the tied embedding
    stored once), converted module by module while the canonical tree is freed, so only one copy
    is ever resident. They decode (``generate``, ``text.complete``, ...) but cannot train, be
    exported or sharded (no ``mesh``). ``weights="int8"`` (``for_decoding`` only; opt-in and
    lossy) stores the matrices as per-column int8 (which ones: ``inference.check_weights``).
    ``greedy_head`` (``for_decoding`` only): whether the LM head gets an int8 screen that greedy
    steps take their argmax through, the same ids (``inference.resolve_greedy_head``; "auto":
    a vocabulary of 32,768 or more on the C++ linear)."""
    from mtpspec.config import check_dtype

    if for_decoding and mesh is not None:
        raise ValueError("for_decoding=True cannot take a mesh: DecodingWeights are not sharded")
    from mtpspec.models import inference

    inference.check_weights(weights, "ffi")  # an unknown value names itself first
    if weights != "stored" and not for_decoding:
        raise ValueError(f"weights={weights!r} is a decoding layout: pass for_decoding=True")
    if greedy_head != "screened":  # an unknown value is named before any read
        inference.resolve_greedy_head(greedy_head, config=None, impl="xla")
    if greedy_head != "auto" and not for_decoding:
        raise ValueError(
            f"greedy_head={greedy_head!r} is a decoding layout: pass for_decoding=True"
        )
    if dtype is _OWN:
        dtype = None if for_decoding else "float32"
    dtype = None if dtype is None else check_dtype(dtype)
    path = pathlib.Path(path)
    if not for_decoding:
        if (path / "params").is_dir():
            return restore_params(path, mesh=mesh, dtype=dtype)
        return load_hf(path, dtype=dtype, allow_missing_mtp=allow_missing_mtp, mesh=mesh)

    impl = inference.resolve_linear(linear)  # a bad or unavailable choice raises before any read
    quant = inference.check_weights(weights, impl)
    if greedy_head == "screened":  # one that cannot run raises before any read
        inference.resolve_greedy_head(greedy_head, None, impl, quant)
    if (path / "params").is_dir():  # orbax restores the whole tree, converted after
        config, params = restore_params(path, dtype=dtype)
        return config, inference.decoding_weights(
            config, params, linear=impl, consume=True, weights=weights, greedy_head=greedy_head
        )

    def on_module(config, key, subtree):  # each layer converted as soon as it is read
        inference.check_finite(subtree)
        compute = inference.compute_config(config, impl)
        return inference.convert_module(compute, key, subtree, impl, consume=True, quant=quant)

    config, params = load_hf(
        path, dtype=dtype, allow_missing_mtp=allow_missing_mtp, on_module=on_module
    )
    inference.check_finite({k: v for k, v in params.items() if k not in ("layers", "mtp")})
    screened = inference.resolve_greedy_head(greedy_head, config, impl, quant) == "screened"
    made = inference.finish_decoding_weights(config, params, impl, True, quant, screened)
    del params
    compiled.return_freed_memory()  # the canonical arrays freed module by module
    return config, made


def load_tokenizer(path, config=None):
    """The tokenizer of a checkpoint directory: its ``tokenizer.json`` (``tokenizers.HFTokenizer``,
    with the chat template and EOS ids found beside it), else the byte tokenizer when the model's
    vocabulary is 256 (the shipped model; ``config`` or the directory's config.json says).
    OSError when neither applies."""
    import json
    import pathlib

    from mtpspec.tokenizers import ByteTokenizer, HFTokenizer

    path = pathlib.Path(path)
    if (path / "tokenizer.json").is_file():
        return HFTokenizer(path)
    vocab = None if config is None else config.vocab_size
    if vocab is None and (path / "config.json").is_file():
        try:
            data = json.loads((path / "config.json").read_text())
        except (json.JSONDecodeError, UnicodeDecodeError) as e:
            raise ValueError(f"{path / 'config.json'} is not valid JSON: {e}") from e
        vocab = data.get("vocab_size", data.get("text_config", {}).get("vocab_size"))
    if vocab == ByteTokenizer.vocab_size:
        return ByteTokenizer()
    raise OSError(
        f"no tokenizer.json in {path} and the vocabulary ({vocab}) is not the 256 byte ids; "
        "copy the model's tokenizer.json (and tokenizer_config.json) there"
    )


__all__ += ["load", "load_tokenizer"]
