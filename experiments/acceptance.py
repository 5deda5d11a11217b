"""Held-out acceptance of a checkpoint's proposer, greedy, on the demo prompts, for each k.

    python -m experiments.acceptance --num_draft=1,2,3,4
    python -m experiments.acceptance --checkpoint=/tmp/run/final --proposer=mtp,ngram --num_draft=3

Prints τ (tokens per verify step) and the per-position acceptance rates (``decoding.stats``).
"""

from __future__ import annotations

from absl import app, flags

import mtpspec
from experiments import cli
from mtpspec import checkpoints

FLAGS = flags.FLAGS
cli.define_checkpoint()
cli.define_speculation(num_draft="3")
cli.define_json_out()
flags.DEFINE_integer("max_new_tokens", 128, "Tokens per prompt.")


def main(argv):
    del argv
    config, params = checkpoints.load(FLAGS.checkpoint)
    tok = cli.tokenizer_for(config, FLAGS.checkpoint)
    prompts = [tok.encode(t) for t in cli.demo_texts()]
    commit = cli.one(cli.commits(), "commit")
    rows = []
    for proposer in cli.proposers():
        for k in cli.num_drafts():
            spec = mtpspec.SpecConfig(proposer, k, commit)
            r = mtpspec.generate(
                config, params, prompts, max_new_tokens=FLAGS.max_new_tokens, speculative=spec
            )
            rates = ", ".join(f"{x:.3f}" for x in r.stats["position_acceptance"])
            print(
                f"{FLAGS.checkpoint}: {proposer} k={k} tau {r.stats['tau']:.3f}, "
                f"per-position acceptance [{rates}]"
            )
            rows.append(dict(proposer=proposer, num_draft=k, tau=r.stats["tau"],
                             position_acceptance=r.stats["position_acceptance"]))  # fmt: skip
    cli.write_json(rows)


if __name__ == "__main__":
    app.run(main)
