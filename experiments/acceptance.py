"""Held-out acceptance of a checkpoint's proposer, greedy, on the demo prompts, for each k.

    python -m experiments.acceptance --num_draft=1,2,3,4
    python -m experiments.acceptance --checkpoint=/tmp/run/final --proposer=mtp,ngram --num_draft=3
    python -m experiments.acceptance --max_new_tokens=512 --by_position=128 --plot=acc.png

Prints τ (tokens per verify step) and the per-position acceptance rates (``decoding.stats``);
``--by_position=B`` also by context position (where in the context each verify step ran, in
B-token ranges: does acceptance fall as the context grows?), and ``--plot`` draws that.
"""

from __future__ import annotations

from absl import flags

import mtpspec
from experiments import cli
from mtpspec import checkpoints
from mtpspec.decoding.stats import by_context_position

FLAGS = flags.FLAGS
cli.define_checkpoint()
cli.define_speculation(num_draft="3")
cli.define_json_out()
flags.DEFINE_integer("max_new_tokens", 128, "Tokens per prompt.")
flags.DEFINE_integer("by_position", 0, "Also report acceptance by context position in ranges of "
                     "this many tokens (0: off).")  # fmt: skip
flags.DEFINE_string("plot", None, "--by_position: draw τ by context position to this PNG.")


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
            row = dict(proposer=proposer, num_draft=k, tau=r.stats["tau"],
                       position_acceptance=r.stats["position_acceptance"])  # fmt: skip
            if FLAGS.by_position:
                row["by_position"] = by_context_position(
                    [len(p) for p in prompts], r.stats["accepted"], k, FLAGS.by_position
                )
                for b in row["by_position"]:
                    first = b["position_acceptance"][0]
                    print(
                        f"    context {b['start']:>6}..{b['start'] + FLAGS.by_position - 1:<6} "
                        f"steps {b['steps']:>5}  tau {b['tau']:.3f}  first draft {first:.3f}"
                    )
            rows.append(row)
    if FLAGS.by_position and FLAGS.plot:
        plot(rows, FLAGS.plot)
    cli.write_json(rows)


def plot(rows, path: str) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(6.4, 4))
    for r in rows:
        xs = [b["start"] + FLAGS.by_position / 2 for b in r["by_position"]]
        ax.plot(xs, [b["tau"] for b in r["by_position"]], marker="o",
                label=f"{r['proposer']} k={r['num_draft']}")  # fmt: skip
    ax.set_xlabel(f"context position of the verify step ({FLAGS.by_position}-token ranges)")
    ax.set_ylabel("τ (accepted + 1 per step)")
    ax.set_title(f"{FLAGS.checkpoint}: acceptance by context position")
    ax.grid(alpha=0.3)
    ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    print(f"plot: {path}")


if __name__ == "__main__":
    cli.run(main)
