"""Memory per device under a (data, model) mesh, from the sharding rules (no weights needed).

    python -m experiments.memory_estimate                        # Qwen3-Next-80B and Qwen3.5-27B
    python -m experiments.memory_estimate --models=qwen3_5_27b --meshes=1x4,1x8 --train
    python -m experiments.memory_estimate --hf_config=/path/to/config.json

Counts exactly the arrays mtpspec holds, placed by ``mtpspec.sharding``: parameters (bf16 unless
--dtype) plus, for inference, the decode state (KV caches in the parameter dtype, GDN state f32,
conv windows) for --batch sequences of --capacity tokens, or with --train AdamW's two
moments and the gradients, in the parameter dtype as ``training.make_optimizer`` keeps them (no
f32 master copy; parameters are replicated over ``data``: no ZeRO / FSDP yet).
Activations and XLA temporaries are not included (``compiled.memory_analysis()`` of a real
program gives those).
"""

from __future__ import annotations

from absl import app, flags

from experiments import cli
from mtpspec import checkpoints, sharding
from mtpspec import config as C

MODELS = {"qwen3_next_80b": C.qwen3_next_80b_a3b, "qwen3_5_27b": C.qwen3_5_27b}
FLAGS = flags.FLAGS
flags.DEFINE_list("models", list(MODELS), f"Published shapes: {sorted(MODELS)}.")
flags.DEFINE_string("hf_config", None, "An HF config.json (or its directory) instead of --models.")
flags.DEFINE_list("meshes", ["1x1", "1x4", "1x8", "2x4", "2x8"], "DATAxMODEL meshes.")
flags.DEFINE_integer("batch", 8, "Sequences in the decode state.")
flags.DEFINE_integer("capacity", 32768, "Tokens per sequence (KV slots).")
flags.DEFINE_string("dtype", "bfloat16", "Parameter dtype.")
flags.DEFINE_bool("train", False, "Add AdamW moments and gradients (f32).")
cli.define_json_out()

GIB = 2**30


def main(argv):
    del argv
    if FLAGS.hf_config:
        configs = {FLAGS.hf_config: checkpoints.from_hf_config(FLAGS.hf_config)}
    else:
        unknown = [m for m in FLAGS.models if m not in MODELS]
        if unknown:
            raise app.UsageError(f"unknown model(s) {unknown}; known: {sorted(MODELS)}")
        configs = {m: MODELS[m]() for m in FLAGS.models}
    rows = []
    for name, config in configs.items():
        print(
            f"\n{name}: batch {FLAGS.batch} x {FLAGS.capacity} tokens, {FLAGS.dtype} weights"
            + (", training (AdamW moments + grads in the param dtype)" if FLAGS.train else "")
        )
        head = f"{'mesh':>6} {'params':>11} {'params/dev':>11}"
        head += f" {'opt+grad/dev':>13}" if FLAGS.train else f" {'state/dev':>10}"
        print(head + f" {'total/dev':>10}  replicated on model")
        for text in FLAGS.meshes:
            d, m = sharding.parse_mesh(text)
            est = sharding.memory_estimate(
                config,
                {"data": d, "model": m},
                batch=FLAGS.batch,
                capacity=FLAGS.capacity,
                param_dtype=FLAGS.dtype,
                train=FLAGS.train,
            )
            rep = sorted({p.split("[")[-1].strip("]'") for p in est["replicated_on_model"]})
            line = (
                f"{text:>6} {est['total_params'] / 1e9:>10.2f}B "
                f"{est['param_bytes_per_device'] / GIB:>9.2f}Gi"
            )
            if FLAGS.train:
                extra = est["optimizer_bytes_per_device"] + est["grad_bytes_per_device"]
                line += f" {extra / GIB:>11.2f}Gi"
            else:
                line += f" {est['state_bytes_per_device'] / GIB:>8.2f}Gi"
            print(line + f" {est['total_bytes_per_device'] / GIB:>8.2f}Gi  {', '.join(rep) or '-'}")
            rows.append({"model": name, "mesh": text, **est})
    print("\n(GiB = 2^30 bytes; activations and XLA temporaries not included)")
    cli.write_json(rows)


if __name__ == "__main__":
    cli.run(main)
