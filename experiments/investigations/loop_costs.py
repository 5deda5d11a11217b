"""What one iteration of the compiled decoding loop costs, per configuration and implementation
choice: the pieces timed alone (``analysis.piece_costs``) leave out how XLA compiles them
together, this times the real loop.

    python -m experiments.investigations.loop_costs --checkpoint=DIR \\
        --configs=none,ngram:2,mtp:1,mtp:2 --attention=ffi,xla --linear=auto --repeats=5

For each (configuration, attention, linear): the demo prompts at batch 1, ``--max_new_tokens``
new tokens, timed round-robin with every other point (``--repeats`` rounds; median), the
prefill-only program (max_new_tokens=1) timed beside it and subtracted; ms per loop iteration =
decode seconds ÷ verify steps, and the same in plain steps of the same implementations.
"""

from __future__ import annotations

import statistics

from absl import app, flags

from experiments import cli
from mtpspec import analysis, checkpoints, decoding

FLAGS = flags.FLAGS
flags.DEFINE_string("checkpoint", str(cli.DEFAULT_MODEL), "Model directory.")
flags.DEFINE_list("configs", ["none", "ngram:2", "mtp:1", "mtp:2"], "proposer:k, or none.")
flags.DEFINE_list("attention", ["ffi", "xla"], "Attention implementations (decoding's option).")
flags.DEFINE_list("linear", ["auto"], "Linear implementations (decoding's option).")
flags.DEFINE_integer("repeats", 5, "Round-robin rounds.")
flags.DEFINE_integer("max_new_tokens", 128, "New tokens per prompt.")


def main(_):
    config, params = checkpoints.load(FLAGS.checkpoint)
    tok = cli.tokenizer_for(config, FLAGS.checkpoint)
    prompts = [tok.encode(t) for t in cli.demo_texts()]
    specs = {}
    for c in FLAGS.configs:
        proposer, _, k = c.partition(":")
        if proposer != "none" and not k.isdigit():
            raise app.UsageError(f"--configs: {c!r} is not none or proposer:k (e.g. mtp:2)")
        specs[c] = None if proposer == "none" else decoding.SpecConfig(proposer, int(k))
    specs["none"] = None
    configs = ["none"] + [c for c in specs if c != "none"]
    impls = [(a, lin) for a in FLAGS.attention for lin in FLAGS.linear]
    points = [(c, impl) for impl in impls for c in configs]

    def run(point, max_new):
        """(device seconds, verify steps); the prefill-only run gets the full run's capacity,
        so it subtracts like for like."""
        attention, linear = point[1]
        _, seconds, stats = analysis.run_point(
            config, params, prompts, specs[point[0]], max_new, linear, attention,
            capacity_for=FLAGS.max_new_tokens,
        )  # fmt: skip
        return seconds, sum(sum(st["steps"]) for st in stats)

    for pt in points:  # compile
        run(pt, FLAGS.max_new_tokens), run(pt, 1)
    full = {pt: [] for pt in points}
    pre = {pt: [] for pt in points}
    steps = {}
    for _ in range(FLAGS.repeats):
        for pt in points:
            sec, steps[pt] = run(pt, FLAGS.max_new_tokens)
            full[pt].append(sec)
            pre[pt].append(run(pt, 1)[0])
    print(
        f"{FLAGS.checkpoint}: {config.num_layers} layers, H={config.hidden_size}; {len(prompts)} "
        f"prompts x {FLAGS.max_new_tokens} new tokens, median of {FLAGS.repeats} round-robin rounds"
    )
    print(f"{'config':10s} {'attention':>9s} {'linear':>6s} {'ms/iter':>8s} {'plain steps':>12s}")
    for impl in impls:
        base = None
        for pt in [p for p in points if p[1] == impl]:
            decode = statistics.median(full[pt]) - statistics.median(pre[pt])
            per = 1e3 * decode / steps[pt]
            base = base or per
            print(f"{pt[0]:10s} {impl[0]:>9s} {impl[1]:>6s} {per:8.3f} {per / base:12.2f}")


if __name__ == "__main__":
    cli.run(main)
