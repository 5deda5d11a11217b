"""Train a hybrid model with an MTP head on the offline stdlib corpus (resumable).

    python -m experiments.train --workdir=/tmp/run --steps=2000          # the default model's shape
    python -m experiments.train --workdir=/tmp/run --steps=2000          # again: resumes
    python -m experiments.train --workdir=/tmp/run2 --preset=tiny --steps=20 --save_every=5
    python -m experiments.train --workdir=/tmp/run3 --mesh=2x4   # sharded; see cli.py

The final params land in WORKDIR/final (``mtpspec.checkpoints.restore_params``); per-step losses in
WORKDIR/metrics.jsonl. Kill it at any point (even SIGKILL) and start the same command again: it
resumes from the last checkpoint with the same data order and loss curve.
"""

from __future__ import annotations

import dataclasses
import pathlib

from absl import app, flags

from experiments import cli
from mtpspec import config as C
from mtpspec.training import TrainConfig, load_corpus, train

FLAGS = flags.FLAGS
cli.define_mesh()
flags.DEFINE_string("workdir", None, "Run directory (checkpoints, metrics, final params).")
flags.DEFINE_enum("preset", "default", ["default", "tiny"], "Model shape.")
flags.DEFINE_string(
    "manifest",
    str(
        pathlib.Path(__file__).resolve().parent.parent
        / "mtpspec"
        / "assets"
        / "corpus_manifest.json"
    ),
    "Corpus manifest (files + sha256).",
)
flags.DEFINE_string("corpus_root", None, "Root the manifest's paths are relative to (stdlib).")
flags.DEFINE_integer("steps", 1000, "Total optimizer steps.")
flags.DEFINE_integer("batch", 16, "Sequences per batch.")
flags.DEFINE_integer("seq_len", 128, "Tokens per sequence.")
flags.DEFINE_float("lr", 3e-3, "Peak learning rate.")
flags.DEFINE_integer("warmup", 50, "Warm-up steps.")
flags.DEFINE_float("mtp_weight", 0.5, "Weight of the MTP loss (joint phase).")
flags.DEFINE_enum("phase", "joint", ["joint", "mtp_only"], "joint, or MTP head on a frozen trunk.")
flags.DEFINE_string(
    "init", None, "Start from these params (restore_params dir), e.g. for mtp_only."
)
flags.DEFINE_integer("seed", 0, "Seed (init and data order).")
flags.DEFINE_integer("save_every", 100, "Checkpoint interval (steps).")
flags.DEFINE_integer("eval_every", 100, "Held-out evaluation interval (steps).")
flags.DEFINE_integer("log_every", 10, "Progress line interval (steps).")
flags.DEFINE_bool(
    "allow_config_change",
    False,
    "Resume a run with other hyper-parameters (refused by default: it mixes two schedules).",
)
flags.DEFINE_integer("kill_at_step", None, "Test hook: SIGKILL this process after that step.")
flags.mark_flag_as_required("workdir")


def main(argv):
    del argv
    mesh = cli.setup_mesh()  # first: multi-host start-up precedes any JAX work
    model = C.default_model() if FLAGS.preset == "default" else C.tiny_hybrid(vocab_size=256)
    init = None
    if FLAGS.init:
        from mtpspec.checkpoints import restore_params

        loaded_config, init = restore_params(FLAGS.init, mesh=mesh)
        model = loaded_config
    tc = TrainConfig(
        steps=FLAGS.steps,
        batch=FLAGS.batch,
        seq_len=FLAGS.seq_len,
        lr=FLAGS.lr,
        warmup=FLAGS.warmup,
        mtp_weight=FLAGS.mtp_weight,
        phase=FLAGS.phase,
        seed=FLAGS.seed,
        save_every=FLAGS.save_every,
        eval_every=FLAGS.eval_every,
        log_every=FLAGS.log_every,
    )
    root = pathlib.Path(FLAGS.corpus_root) if FLAGS.corpus_root else None
    corpus = load_corpus(FLAGS.manifest, root=root)
    print(f"model: {dataclasses.asdict(model)}")
    print(f"corpus: {len(corpus.train):,} train bytes, {len(corpus.eval):,} held-out bytes")
    _, metrics = train(
        model, tc, corpus, FLAGS.workdir, init=init, kill_at_step=FLAGS.kill_at_step, mesh=mesh,
        allow_config_change=FLAGS.allow_config_change,
    )  # fmt: skip
    print(f"final held-out: {metrics}")


if __name__ == "__main__":
    app.run(main)
