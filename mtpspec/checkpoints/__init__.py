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


def load(path, *, mesh=None):
    """An mtpspec checkpoint (``save_params``: config.json + params/) or an HF directory
    (config.json + safetensors, loaded as float32). Returns (config, params); with ``mesh`` the
    params are placed shard by shard by the ``mtpspec.sharding`` rules."""
    import pathlib

    path = pathlib.Path(path)
    if (path / "params").is_dir():
        return restore_params(path, mesh=mesh)
    return load_hf(path, dtype="float32", mesh=mesh)


__all__ += ["load"]
