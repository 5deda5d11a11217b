"""Export a checkpoint (default: the shipped default model) as an HF Qwen3.5 / Qwen3-Next directory.

    python -m experiments.export_hf --out=/tmp/default_hf                       # Qwen3.5 layout
    python -m experiments.export_hf --out=/tmp/default_hf_next --family=qwen3_next
    python -m experiments.export_hf --checkpoint=/tmp/run/final --out=DIR --dtype=bfloat16

--checkpoint is an mtpspec checkpoint (config.json + params/) or an HF directory. The tokenizer
(--tokenizer=auto) is the checkpoint's tokenizer.json when it has one, else the byte tokenizer
when the vocabulary is 256 (what experiments.train and experiments.generate use), else none.
After writing, the directory is read back with ``checkpoints.load_hf`` and compared with the
source parameters (cast to the stored dtype) bit for bit; the script prints the files and the
result. ``python -m experiments.check_hf_export --checkpoint=OUT`` then checks it in transformers.
"""

from __future__ import annotations

import dataclasses
import pathlib

import jax
import numpy as np
from absl import flags

from experiments import cli
from mtpspec import checkpoints
from mtpspec.tokenizers import ByteTokenizer

FLAGS = flags.FLAGS
cli.define_checkpoint("Checkpoint to export.")
flags.DEFINE_string("out", None, "Output directory (absent or empty, unless --overwrite).")
flags.DEFINE_string("family", None, "qwen3_5 | qwen3_next (default: the checkpoint's family).")
flags.DEFINE_string("dtype", None, "float32 | bfloat16 storage dtype (default: the config's).")
flags.DEFINE_integer(
    "max_shard_bytes",
    checkpoints.hf_export.DEFAULT_MAX_SHARD_BYTES,
    "Shard the weights past this many bytes.",
)
flags.DEFINE_integer(
    "max_position_embeddings",
    checkpoints.hf_config.DEFAULT_MAX_POSITION_EMBEDDINGS,
    "Written to config.json (vLLM's default max_model_len).",
)
flags.DEFINE_string("tokenizer", "auto", "auto | bytes | none | path to a tokenizer.json.")
flags.DEFINE_bool("overwrite", False, "Replace an earlier export in --out.")
flags.mark_flag_as_required("out")


def resolve_tokenizer(choice: str, config, checkpoint: pathlib.Path):
    """The ``tokenizer`` argument for ``save_hf`` from the --tokenizer flag."""
    if choice == "none":
        return None
    if choice == "bytes":
        return ByteTokenizer()
    if choice == "auto":
        if (checkpoint / "tokenizer.json").is_file():
            return checkpoint / "tokenizer.json"
        return ByteTokenizer() if config.vocab_size == ByteTokenizer.vocab_size else None
    return pathlib.Path(choice)


def bit_equal(a, b) -> bool:
    a, b = np.asarray(a), np.asarray(b)
    return a.dtype == b.dtype and a.shape == b.shape and a.tobytes() == b.tobytes()


def main(argv):
    del argv
    src = pathlib.Path(FLAGS.checkpoint)
    config, params = checkpoints.load(src)
    tokenizer = resolve_tokenizer(FLAGS.tokenizer, config, src)
    files = checkpoints.save_hf(
        config,
        params,
        FLAGS.out,
        family=FLAGS.family,
        dtype=FLAGS.dtype,
        max_shard_bytes=FLAGS.max_shard_bytes,
        tokenizer=tokenizer,
        max_position_embeddings=FLAGS.max_position_embeddings,
        overwrite=FLAGS.overwrite,
    )
    out = pathlib.Path(FLAGS.out)
    for f in files:
        print(f"{f:<40} {(out / f).stat().st_size:>12,d} bytes")

    family = FLAGS.family or config.family
    dtype = FLAGS.dtype or config.dtype
    back_config, back = checkpoints.load_hf(out)
    want = jax.tree.map(lambda x: np.asarray(x.astype(dtype)), params)
    same_config = back_config == dataclasses.replace(config, family=family, dtype=dtype)
    same = jax.tree.all(jax.tree.map(bit_equal, back, want))
    n = sum(x.size for x in jax.tree.leaves(params))
    print(
        f"exported {src} -> {out} as {family} ({dtype}, {n:,d} parameters, tokenizer: "
        f"{type(tokenizer).__name__ if tokenizer is not None else 'none'})"
    )
    print(f"load_hf read-back: config equal {same_config}, params bit-equal {same}")
    if not (same_config and same):
        raise SystemExit("read-back differs from the source checkpoint")


if __name__ == "__main__":
    cli.run(main)
