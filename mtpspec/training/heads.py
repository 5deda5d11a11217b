"""A base model for MTP-head training: any checkpoint, with its MTP head or a fresh one.

    config, params, tokenizer, fresh = load_base(DIR, seed=0)

``DIR`` is an HF directory (Qwen3.5 / Qwen3-Next / Qwen3.5-MoE; ``mtp.*`` tensors optional) or an
mtpspec checkpoint (``checkpoints.save_params``). Without MTP weights the config gets one MTP layer
(its MLP of the kind the family uses there: ``config.mtp_mlp_type``, as read from the HF config,
i.e. the kind of layer 0) and a fresh head: the MTP subtree of ``models.init_params`` seeded by
``seed`` — linear weights N(0, 1/fan_in), (1 + w) norms at zero (identity), attention and MoE
weights as in a fresh trunk layer. The trunk's weights are returned exactly as loaded.
"""

from __future__ import annotations

import dataclasses
import os
import pathlib

import jax

from mtpspec import checkpoints
from mtpspec.models.params import init_params


def load_base(path: str | os.PathLike, *, seed: int = 0, dtype: str | None = "float32", mesh=None):
    """(config, params, tokenizer, fresh_head). OSError when ``path`` is neither checkpoint."""
    path = pathlib.Path(path)
    if not (path / "params").is_dir() and not (path / "config.json").is_file():
        raise OSError(
            f"{path} is neither an HF checkpoint (config.json + safetensors) nor an mtpspec one "
            "(config.json + params/)"
        )
    config, params = checkpoints.load(path, dtype=dtype, mesh=mesh, allow_missing_mtp=True)
    tokenizer = checkpoints.load_tokenizer(path, config)
    fresh = "mtp" not in params
    if fresh:
        config = dataclasses.replace(config, mtp_num_layers=1)
        params = {**params, "mtp": init_params(config, jax.random.key(seed))["mtp"]}
        if mesh is not None:
            from mtpspec import sharding

            params = sharding.shard_params(config, params, mesh)
    return config, params, tokenizer, fresh
