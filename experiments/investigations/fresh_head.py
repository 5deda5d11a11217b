"""Issue 18's first done-when, end to end: give a base model WITHOUT MTP weights a fresh MTP head,
trained on a directory of text files, and measure what it buys on held-out prompts.

    python -m experiments.investigations.fresh_head --workdir=/tmp/fresh_head --steps=300
    python -m experiments.investigations.fresh_head --workdir=/tmp/fresh_head --steps=300  # resumes

1. WORKDIR/base: the shipped default model exported as an HF directory (``save_hf``) with its
   MTP head removed (config without MTP layers, no mtp.* tensors), byte tokenizer included.
2. WORKDIR/data: the training split of the default model's stdlib corpus as a directory of text
   files (the held-out demo prompts are not in it).
3. ``--init=WORKDIR/base --phase=mtp_only --data=WORKDIR/data`` through ``training.train`` (the
   same code as ``experiments.train``), distillation loss by default: WORKDIR/run (resumable).
4. On the held-out demo prompts: plain greedy of the base vs of the trained checkpoint (must be
   identical: the trunk is frozen), and MTP speculative τ and per-position acceptance for each
   --num_draft, with the same tokens as plain greedy. --json_out writes the table.
"""

from __future__ import annotations

import dataclasses
import pathlib
import shutil

from absl import flags

import mtpspec
from experiments import cli
from mtpspec import checkpoints
from mtpspec.tokenizers import ByteTokenizer
from mtpspec.training import TrainConfig, load_base, load_text, train
from mtpspec.training import data as data_lib

FLAGS = flags.FLAGS
cli.define_json_out()
flags.DEFINE_string("workdir", None, "Where the base, the data and the run go.")
flags.DEFINE_integer("steps", 300, "Training steps of the fresh head.")
flags.DEFINE_integer("batch", 16, "Sequences per batch.")
flags.DEFINE_integer("seq_len", 128, "Tokens per sequence.")
flags.DEFINE_float("lr", 3e-3, "Peak learning rate.")
flags.DEFINE_enum("loss", "distill", ["distill", "ce"], "The head's loss.")
flags.DEFINE_list("num_draft", "1,2", "k values to measure.")
flags.DEFINE_integer("max_new_tokens", 128, "Tokens per held-out prompt.")
flags.mark_flag_as_required("workdir")


def make_base(path: pathlib.Path) -> None:
    config, params = checkpoints.load(cli.DEFAULT_MODEL)
    bare = dataclasses.replace(config, mtp_num_layers=0)
    params = {k: v for k, v in params.items() if k != "mtp"}
    checkpoints.save_hf(bare, params, path, tokenizer=ByteTokenizer())


def make_data(path: pathlib.Path) -> int:
    import json

    manifest = json.loads((cli.ASSETS / "corpus_manifest.json").read_text())
    root, n = data_lib.stdlib_root(), 0
    tmp = path.with_name(path.name + ".tmp")
    shutil.rmtree(tmp, ignore_errors=True)
    for entry in manifest["files"]:
        if data_lib.is_eval_file(entry["path"], 0.1):  # the default model's held-out files
            continue
        dst = tmp / entry["path"]
        dst.parent.mkdir(parents=True, exist_ok=True)
        dst.write_bytes((root / entry["path"]).read_bytes())
        n += 1
    tmp.rename(path)
    return n


def main(argv):
    del argv
    work = pathlib.Path(FLAGS.workdir)
    work.mkdir(parents=True, exist_ok=True)
    if not (work / "base" / "config.json").is_file():
        make_base(work / "base")
    if not (work / "data").is_dir():
        print(f"data: {make_data(work / 'data')} files")
    config, params, tok, fresh = load_base(work / "base")
    assert fresh, "the base must come without an MTP head"
    corpus = load_text(work / "data", tok)
    tc = TrainConfig(
        steps=FLAGS.steps, batch=FLAGS.batch, seq_len=FLAGS.seq_len, lr=FLAGS.lr, warmup=20,
        phase="mtp_only", loss=FLAGS.loss, save_every=50, eval_every=100, log_every=25,
    )  # fmt: skip
    train(config, tc, corpus, work / "run", init=params)

    base_cfg, base_params = checkpoints.load(work / "base")
    cfg, trained = checkpoints.load(work / "run" / "final")
    prompts = [tok.encode(t) for t in cli.demo_texts()]
    kw = dict(max_new_tokens=FLAGS.max_new_tokens)
    plain_base = mtpspec.generate(base_cfg, base_params, prompts, **kw).tokens
    plain = mtpspec.generate(cfg, trained, prompts, **kw).tokens
    rows = [{"greedy_unchanged": plain == plain_base}]
    print(f"plain greedy of the trained checkpoint == the base's: {plain == plain_base}")
    for k in [int(x) for x in FLAGS.num_draft]:
        spec = mtpspec.SpecConfig("mtp", k)
        r = mtpspec.generate(cfg, trained, prompts, speculative=spec, **kw)
        rates = ", ".join(f"{x:.3f}" for x in r.stats["position_acceptance"])
        print(
            f"fresh head after {FLAGS.steps} steps ({FLAGS.loss}): MTP k={k} tau "
            f"{r.stats['tau']:.3f}, per-position acceptance [{rates}], same tokens "
            f"{r.tokens == plain}"
        )
        rows.append(dict(num_draft=k, tau=r.stats["tau"], same_tokens=r.tokens == plain,
                         position_acceptance=r.stats["position_acceptance"]))  # fmt: skip
    cli.write_json(rows)


if __name__ == "__main__":
    cli.run(main)
