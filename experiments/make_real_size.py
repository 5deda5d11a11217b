"""Write a real-size Qwen3.5 checkpoint directory with random weights (the bench's fixture).

    python -m experiments.make_real_size --out=/tmp/qwen3_5_0_8b          # the 0.8B shape
    python -m experiments.make_real_size --out=DIR --hidden=256 --layers=4  # reduced, same vocab

What a user brings from the hub, minus the training: Qwen3.5-0.8B's published text config
(``config.qwen3_5_0_8b``: 24 layers, 18 GDN + 6 gated attention, H 1024, a 248,320-token tied
vocabulary, one MTP layer), bf16, in the released repos' layout
(``Qwen3_5ForConditionalGeneration``: nested ``text_config``, ``model.language_model.*``,
``mtp.*``), sharded with an index. Weights are drawn at the scales of HF's initialisation
(``Qwen3_5PreTrainedModel._init_weights``): linear and embedding N(0, 0.02²), (1 + w) norms
zero, the GDN output norm one, ``dt_bias`` one, ``A_log`` = log U(0, 16), conv1d U(±1/√W).
Nothing is downloaded; the directory is generated locally (never committed; 1.55 GB at the
full shape) in under a minute.

The HF oracle for it (transformers' float32 logits and a greedy continuation on these bf16
weights) is ``experiments/real_size_oracle.py``, run with torch + transformers installed.
"""

from __future__ import annotations

import dataclasses
import json
import time

import jax
import jax.numpy as jnp
import numpy as np
from absl import flags

from experiments import cli
from mtpspec import config as C
from mtpspec.checkpoints import save_hf
from mtpspec.models.params import param_shapes

FLAGS = flags.FLAGS
flags.DEFINE_string("out", None, "Directory to write (absent or empty).", required=True)
flags.DEFINE_integer("seed", 0, "Seed of the random weights.")
flags.DEFINE_integer("hidden", None, "Override the hidden size (a reduced shape for tests).")
flags.DEFINE_integer("layers", None, "Override the layer count (a multiple of 4).")
flags.DEFINE_integer("shard_mb", 1000, "Shard size in MB (the index is written above it).")
flags.DEFINE_bool("overwrite", False, "Replace an earlier export in --out.")

STD = 0.02  # the config's initializer_range


def real_size_config(hidden: int | None = None, layers: int | None = None) -> C.ModelConfig:
    """``config.qwen3_5_0_8b``, optionally reduced in width or depth (the vocabulary stays)."""
    cfg = C.qwen3_5_0_8b()
    if layers is not None:
        if layers < 4 or layers % 4:
            raise ValueError(f"--layers must be a positive multiple of 4, got {layers}")
        cfg = dataclasses.replace(
            cfg,
            layer_types=cfg.layer_types[:4] * (layers // 4),
            mlp_types=cfg.mlp_types[:4] * (layers // 4),
        )
    if hidden is not None:
        if hidden < 64 or hidden % 64:
            raise ValueError(f"--hidden must be a positive multiple of 64, got {hidden}")
        cfg = dataclasses.replace(cfg, hidden_size=hidden, intermediate_size=hidden * 7 // 2)
    return cfg


def _draw(rng: np.random.Generator, path, shape: tuple, conv_width: int) -> np.ndarray:
    name = str(getattr(path[-1], "key", ""))
    parent = str(getattr(path[-2], "key", "")) if len(path) >= 2 else ""
    if name == "A_log":
        return np.log(rng.uniform(1e-6, 16.0, shape)).astype(np.float32)
    if name == "dt_bias" or (name == "norm" and parent == "gdn"):
        return np.ones(shape, np.float32)
    if len(shape) == 1:  # (1 + w) norms: zero init
        return np.zeros(shape, np.float32)
    if name == "conv":
        bound = conv_width**-0.5
        return rng.uniform(-bound, bound, shape).astype(np.float32)
    return rng.standard_normal(shape, dtype=np.float32) * np.float32(STD)


def random_params(cfg: C.ModelConfig, seed: int) -> dict:
    """HF-init-scale random weights in ``cfg.dtype`` (host numpy arrays)."""
    rng = np.random.default_rng(seed)
    dtype = jnp.dtype(cfg.dtype)
    leaves, treedef = jax.tree_util.tree_flatten_with_path(
        param_shapes(cfg),
        is_leaf=lambda x: isinstance(x, tuple) and all(isinstance(d, int) for d in x),
    )
    out = [_draw(rng, p, s, cfg.linear_conv_kernel_dim).astype(dtype) for p, s in leaves]
    return jax.tree_util.tree_unflatten(treedef, out)


def main(argv):
    del argv
    cfg = real_size_config(FLAGS.hidden, FLAGS.layers)
    t0 = time.perf_counter()
    params = random_params(cfg, FLAGS.seed)
    n = sum(x.size for x in jax.tree.leaves(params))
    files = save_hf(
        cfg, params, FLAGS.out, max_shard_bytes=FLAGS.shard_mb * 10**6,
        layout="conditional_generation", overwrite=FLAGS.overwrite,
    )  # fmt: skip
    print(
        json.dumps(
            {
                "out": FLAGS.out,
                "parameters": int(n),
                "bytes": int(sum(x.nbytes for x in jax.tree.leaves(params))),
                "files": files,
                "seconds": round(time.perf_counter() - t0, 1),
            }
        )
    )


if __name__ == "__main__":
    cli.run(main)
