"""Train a hybrid model with an MTP head (resumable), or an MTP head for any base model.

    python -m experiments.train --workdir=/tmp/run --steps=2000          # the default model's shape
    python -m experiments.train --workdir=/tmp/run --steps=2000          # again: resumes
    python -m experiments.train --workdir=/tmp/run2 --preset=tiny --steps=20 --save_every=5
    python -m experiments.train --workdir=/tmp/run3 --mesh=2x4   # sharded; see cli.py

    # an MTP head for your own model (HF directory or mtpspec checkpoint, with or without mtp.*):
    python -m experiments.train --init=DIR --phase=mtp_only --data=PATH --steps=500 --workdir=W

--data is a text file, a directory of text files or a JSONL file with a "text" field, tokenized
with the model's own tokenizer (``checkpoints.load_tokenizer``; bytes for the 256 vocabulary);
without --data, the offline stdlib corpus (byte models only). ``--phase=mtp_only`` freezes the
trunk (no optimizer state for it) and trains the head with ``--loss=distill`` by default (KL from
the trunk's own distribution of the token after next: what acceptance rewards) or ``--loss=ce``.
A base without MTP weights gets a fresh head (``mtpspec.training.heads``). ``--mtp_depth=3``
trains the head chained on its own output, as it drafts for num_draft >= 2 (how the shipped
default model's head was made: docs/decisions.md §6).

The final params land in WORKDIR/final (``checkpoints.load``; ``experiments.export_hf`` writes
them as an HF directory); per-step metrics (losses, learning rate) in WORKDIR/metrics.jsonl and as
TensorBoard events in WORKDIR/tb. Progress: a bar with ETA on a terminal, else a line every
--log_every steps with tok/s (compile and evaluation excluded) and ETA. Kill it at any point (even
SIGKILL) and start the same command again: it resumes from the last checkpoint with the same data
order and loss curve. Started again with a larger --steps, it trains on to the new total; the
learning-rate schedule stays the run's own (cosine decay to the first --steps, then its final
rate; logged, and recorded as decay_steps in WORKDIR/train_config.json). Any other changed
hyper-parameter is refused (--allow_config_change to continue anyway).

Too little text for --seq_len (each split needs seq_len + 1 tokens) is an error naming the token
counts; one small file or a few short documents are split by tokens (the last 10 % of them held
out, at least one sequence) when a split by document cannot give each split a sequence.
"""

from __future__ import annotations

import dataclasses
import pathlib

from absl import app, flags

from experiments import cli
from mtpspec import config as C
from mtpspec.training import TrainConfig, load_base, load_corpus, load_text, train

FLAGS = flags.FLAGS
cli.define_mesh()
flags.DEFINE_string("workdir", None, "Run directory (checkpoints, metrics, final params).")
flags.DEFINE_enum("preset", "default", ["default", "tiny"], "Model shape.")
flags.DEFINE_string(
    "shape", None, "LAYERSxHIDDEN: config.default_like at that size (overrides --preset)."
)
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
flags.DEFINE_integer(
    "decay_steps", None, "Step the cosine decay ends at (default: --steps; a resume with a larger "
    "--steps keeps the run's own and trains on at the final rate).",
)  # fmt: skip
flags.DEFINE_float("mtp_weight", 0.5, "Weight of the MTP loss (joint phase).")
flags.DEFINE_integer(
    "mtp_depth", 1, "Train the MTP head chained on its own output over this many drafts, as the "
    "proposer uses it for num_draft >= 2 (loss averaged over the depths).",
)  # fmt: skip
flags.DEFINE_enum("phase", "joint", ["joint", "mtp_only"], "joint, or MTP head on a frozen trunk.")
flags.DEFINE_enum(
    "loss", None, ["ce", "distill"],
    "MTP loss: distill (default for mtp_only: KL from the trunk) or ce (the data).",
)  # fmt: skip
flags.DEFINE_string(
    "init", None, "Start from this model: an HF directory or an mtpspec checkpoint (MTP optional)."
)
flags.DEFINE_string(
    "data", None, "Training text: a file, a directory of text files, or JSONL with 'text'."
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
    from mtpspec.tokenizers import ByteTokenizer

    mesh = cli.setup_mesh()  # first: multi-host start-up precedes any JAX work
    model = C.default_model() if FLAGS.preset == "default" else C.tiny_hybrid(vocab_size=256)
    if FLAGS.shape:
        try:
            layers, hidden = (int(x) for x in FLAGS.shape.lower().split("x"))
        except ValueError as e:
            msg = f"--shape must be LAYERSxHIDDEN, e.g. 12x256, got {FLAGS.shape!r}"
            raise app.UsageError(msg) from e
        model = C.default_like(layers, hidden)
    init, tokenizer = None, ByteTokenizer()
    if FLAGS.init:
        model, init, tokenizer, fresh = load_base(FLAGS.init, seed=FLAGS.seed, mesh=mesh)
        head = "a fresh MTP head (no mtp.* weights)" if fresh else "its own MTP head"
        print(
            f"init: {FLAGS.init} ({model.num_layers} layers, vocabulary {model.vocab_size}), {head}"
        )
    loss = FLAGS.loss or ("distill" if FLAGS.phase == "mtp_only" else "ce")
    tc = TrainConfig(
        steps=FLAGS.steps,
        batch=FLAGS.batch,
        seq_len=FLAGS.seq_len,
        lr=FLAGS.lr,
        warmup=FLAGS.warmup,
        decay_steps=FLAGS.decay_steps,
        mtp_weight=FLAGS.mtp_weight,
        mtp_depth=FLAGS.mtp_depth,
        phase=FLAGS.phase,
        loss=loss,
        seed=FLAGS.seed,
        save_every=FLAGS.save_every,
        eval_every=FLAGS.eval_every,
        log_every=FLAGS.log_every,
    )
    if FLAGS.data:
        corpus = load_text(FLAGS.data, tokenizer, seq_len=FLAGS.seq_len)
        what = f"{FLAGS.data} (split {corpus.split})"
    elif model.vocab_size != ByteTokenizer.vocab_size:
        raise app.UsageError(
            f"the model's vocabulary is {model.vocab_size}, not bytes: give --data (its text)"
        )
    else:
        root = pathlib.Path(FLAGS.corpus_root) if FLAGS.corpus_root else None
        corpus = load_corpus(FLAGS.manifest, root=root, seq_len=FLAGS.seq_len)
        what = "the stdlib corpus"
    print(f"model: {dataclasses.asdict(model)}")
    print(f"data: {what}: {len(corpus.train):,} train tokens, {len(corpus.eval):,} held-out")
    _, metrics = train(
        model, tc, corpus, FLAGS.workdir, init=init, kill_at_step=FLAGS.kill_at_step, mesh=mesh,
        allow_config_change=FLAGS.allow_config_change,
    )  # fmt: skip
    print(f"final held-out: {metrics}")


if __name__ == "__main__":
    cli.run(main)
