"""Held-out acceptance of a checkpoint's proposer, greedy, on the demo prompts, for each k.

    python -m experiments.acceptance --num_draft=1,2,3,4
    python -m experiments.acceptance --checkpoint=/tmp/run/final --proposer=mtp,ngram --num_draft=3
    python -m experiments.acceptance --max_new_tokens=512 --by_position=128 --plot=acc.png
    python -m experiments.acceptance --num_draft=3 --p_min=0.5 --adaptive --by_position=64

Prints τ (tokens per verify step), the per-position acceptance rates (``decoding.stats``) and the
mean number of drafts per step; ``--p_min`` / ``--adaptive`` add the drafting that adapts beside
the fixed chains (the configurations ``bench_speculative`` sweeps). ``--by_position=B`` also
reports them by context position (where in the context each verify step ran, in B-token ranges:
does acceptance fall as the context grows, and how long does an adapting draft get there?), and
``--plot`` draws τ and the drafts per step against it.
"""

from __future__ import annotations

from absl import app, flags

import mtpspec
from experiments import cli
from mtpspec import analysis, checkpoints
from mtpspec.decoding.stats import by_context_position

FLAGS = flags.FLAGS
cli.define_checkpoint()
cli.define_speculation(num_draft="3")
cli.define_adaptive()
cli.define_json_out()
flags.DEFINE_integer("max_new_tokens", 128, "Tokens per prompt.")
flags.DEFINE_integer("by_position", 0, "Also report acceptance by context position in ranges of "
                     "this many tokens (0: off).")  # fmt: skip
flags.DEFINE_string("plot", None, "--by_position: draw τ by context position to this PNG.")


def points() -> list[analysis.Point]:
    """Every proposer x k as a fixed chain, then the adapting configurations."""
    commit = cli.one(cli.commits(), "commit")
    proposers = [p for p in cli.proposers() if p != "none"]
    ks = cli.num_drafts()
    fixed = [analysis.Point(p, k, commit) for p in proposers for k in ks]
    try:
        extra = analysis.adaptive_points(proposers, ks, commit, "auto", FLAGS.p_min, FLAGS.adaptive)
    except ValueError as e:
        raise app.UsageError(f"--p_min: {e}") from None
    return fixed + extra


def main(argv):
    del argv
    config, params = checkpoints.load(FLAGS.checkpoint)
    tok = cli.tokenizer_for(config, FLAGS.checkpoint)
    prompts = [tok.encode(t) for t in cli.demo_texts()]
    rows = []
    for point in points():
        spec = analysis.spec_for(point)
        r = mtpspec.generate(
            config, params, prompts, max_new_tokens=FLAGS.max_new_tokens, speculative=spec
        )
        rates = ", ".join(f"{x:.3f}" for x in r.stats["position_acceptance"])
        print(
            f"{FLAGS.checkpoint}: {point.label} tau {r.stats['tau']:.3f}, per-position "
            f"acceptance [{rates}], drafts per step {r.stats['mean_drafted']:.2f}"
        )
        row = dict(proposer=point.proposer, num_draft=point.k, p_min=point.p_min,
                   adaptive=point.adaptive, label=point.label, tau=r.stats["tau"],
                   position_acceptance=r.stats["position_acceptance"],
                   mean_drafted=r.stats["mean_drafted"])  # fmt: skip
        if FLAGS.by_position:
            row["by_position"] = by_context_position(
                [len(p) for p in prompts], r.stats["accepted"], point.k, FLAGS.by_position,
                drafted=r.stats["drafted"],
            )  # fmt: skip
            for b in row["by_position"]:
                first = b["position_acceptance"][0]
                print(
                    f"    context {b['start']:>6}..{b['start'] + FLAGS.by_position - 1:<6} "
                    f"steps {b['steps']:>5}  tau {b['tau']:.3f}  first draft {first:.3f}  "
                    f"drafts per step {b['mean_drafted']:.2f}"
                )
        rows.append(row)
    if FLAGS.by_position and FLAGS.plot:
        plot(rows, FLAGS.plot)
    cli.write_json(rows)


def plot(rows, path: str) -> None:
    """τ (left) and the drafts per verify step (right) by context position, one line per
    configuration."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (ax, bx) = plt.subplots(1, 2, figsize=(11, 4))
    for r in rows:
        xs = [b["start"] + FLAGS.by_position / 2 for b in r["by_position"]]
        ax.plot(xs, [b["tau"] for b in r["by_position"]], marker="o", label=r["label"])
        bx.plot(xs, [b["mean_drafted"] for b in r["by_position"]], marker="o", label=r["label"])
    for a, y in ((ax, "τ (accepted + 1 per step)"), (bx, "drafts per verify step")):
        a.set_xlabel(f"context position of the verify step ({FLAGS.by_position}-token ranges)")
        a.set_ylabel(y)
        a.grid(alpha=0.3)
    ax.set_title(f"{FLAGS.checkpoint}: acceptance by context position", fontsize=9)
    bx.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    print(f"plot: {path}")


if __name__ == "__main__":
    cli.run(main)
