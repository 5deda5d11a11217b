"""Held-out MTP acceptance of one or more checkpoints, greedy, on the demo prompts.

    python -m experiments.acceptance --checkpoints=mtpspec/assets/default_model,/tmp/run/final --k=3

Prints τ (tokens per verify step) and the per-position acceptance rates for each checkpoint.
"""

from __future__ import annotations

import json
import pathlib

from absl import app, flags

import mtpspec
from mtpspec import checkpoints
from mtpspec.training import ByteTokenizer

ASSETS = pathlib.Path(__file__).resolve().parent.parent / "mtpspec" / "assets"
FLAGS = flags.FLAGS
flags.DEFINE_list("checkpoints", [str(ASSETS / "default_model")], "Checkpoint directories.")
flags.DEFINE_integer("k", 3, "Drafts per verify step.")
flags.DEFINE_enum("proposer", "mtp", ["mtp", "ngram"], "Proposer.")
flags.DEFINE_integer("max_new_tokens", 128, "Tokens per prompt.")


def main(argv):
    del argv
    tok = ByteTokenizer()
    spec_file = json.loads((ASSETS / "demo_prompts.json").read_text())
    prompts = [tok.encode(p["text"]) for p in spec_file["prompts"]]
    spec = mtpspec.SpecConfig(FLAGS.proposer, FLAGS.k, "replay")
    for path in FLAGS.checkpoints:
        config, params = checkpoints.load(path)
        r = mtpspec.generate(
            config, params, prompts, max_new_tokens=FLAGS.max_new_tokens, speculative=spec
        )
        rates = ", ".join(f"{x:.3f}" for x in r.stats["position_acceptance"])
        print(
            f"{path}: {FLAGS.proposer} k={FLAGS.k} tau {r.stats['tau']:.3f}, "
            f"per-position acceptance [{rates}]"
        )


if __name__ == "__main__":
    app.run(main)
