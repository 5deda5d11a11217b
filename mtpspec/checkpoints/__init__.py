"""Checkpoints: HF safetensors import (``load_hf``) and export (``save_hf``), the HF config mapping
both ways (``from_hf_config`` / ``hf_config_dict``), and orbax save / restore of the param tree."""

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


def load(path, *, mesh=None, dtype: str | None = "float32", allow_missing_mtp: bool = False):
    """An mtpspec checkpoint (``save_params``: config.json + params/) or an HF directory
    (config.json + safetensors). ``dtype``: "float32" | "bfloat16" (``config.DTYPES``; a NumPy /
    JAX dtype naming one is accepted) casts every floating-point weight on load, for either
    kind; None keeps the checkpoint's own; anything else is a ValueError naming it, before any
    read. ``allow_missing_mtp``: an HF config that declares MTP layers whose ``mtp.*`` tensors
    are absent loads without them, as ``load_hf``. Returns (config, params), ``config.dtype``
    the params' dtype; with ``mesh`` the params are placed shard by shard by the
    ``mtpspec.sharding`` rules."""
    import pathlib

    from mtpspec.config import check_dtype

    dtype = None if dtype is None else check_dtype(dtype)
    path = pathlib.Path(path)
    if (path / "params").is_dir():
        return restore_params(path, mesh=mesh, dtype=dtype)
    return load_hf(path, dtype=dtype, allow_missing_mtp=allow_missing_mtp, mesh=mesh)


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
