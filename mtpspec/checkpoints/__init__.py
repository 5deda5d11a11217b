"""Checkpoints: HF safetensors import (``load_hf``) and orbax save / restore of the param tree."""

from mtpspec.checkpoints.hf import load_hf
from mtpspec.checkpoints.orbax_io import restore_params, save_params

__all__ = ["load_hf", "restore_params", "save_params"]
