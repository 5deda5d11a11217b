"""What one iteration of the compiled decoding loop costs, per configuration, with and without a
piece (in-loop ablations): the pieces timed alone (``analysis.piece_costs``) leave out how XLA
compiles them together, this times the real loop.

    python -m experiments.loop_costs --checkpoint=DIR --configs=none,ngram:2,mtp:1,mtp:2 \\
        --variants=full,xla_attention,no_commit --repeats=5

For each (configuration, variant): the demo prompts at batch 1, 128 new tokens, timed round-robin
with every other point (``--repeats`` rounds; median), the prefill-only program (max_new_tokens=1)
timed beside it and subtracted; ms per loop iteration = decode seconds ÷ verify steps, and the
same in plain steps of the same variant. Variants (timing only — an ablated loop emits wrong
tokens, so its step count differs):
  full           the loop as decoding runs it
  xla_attention  XLA's attention form instead of the C++ attention kernel (same tokens)
  no_commit      the verified state kept as is: the KV-only rewind (wrong for GDN), i.e. the loop
                 without the commit
"""

from __future__ import annotations

import statistics

import jax
from absl import app, flags

from experiments import cli
from mtpspec import checkpoints, decoding
from mtpspec.decoding import api, program, stages
from mtpspec.decoding.commit import rewind_kv_only
from mtpspec.models import layers

FLAGS = flags.FLAGS
flags.DEFINE_string("checkpoint", str(cli.DEFAULT_MODEL), "Model directory.")
flags.DEFINE_list("configs", ["none", "ngram:2", "mtp:1", "mtp:2"], "proposer:k, or none.")
flags.DEFINE_list("variants", ["full", "xla_attention"], "full | xla_attention | no_commit.")
flags.DEFINE_integer("repeats", 5, "Round-robin rounds.")
flags.DEFINE_integer("max_new_tokens", 128, "New tokens per prompt.")

_commit, _native = stages.commit, layers.native_attention


def _no_commit(s, snapshot, verified, n):
    return rewind_kv_only(snapshot, verified.state, n) if s.k else _commit(s, snapshot, verified, n)


def _use(variant: str, caches: dict) -> None:
    """Patch the pieces for ``variant`` and switch to its own program cache (the patches change
    the traced program, not its ProgramKey)."""
    stages.commit = _no_commit if variant == "no_commit" else _commit
    layers.native_attention = (lambda p, t: False) if variant == "xla_attention" else _native
    if variant not in caches:
        jax.clear_caches()
        caches[variant] = program.ProgramCache(64)
    program.CACHE = api.CACHE = caches[variant]


def main(_):
    config, params = checkpoints.load(FLAGS.checkpoint)
    tok = cli.tokenizer_for(config, FLAGS.checkpoint)
    prompts = [tok.encode(t) for t in cli.demo_texts()]
    specs = {}
    for c in FLAGS.configs:
        proposer, _, k = c.partition(":")
        specs[c] = None if proposer == "none" else decoding.SpecConfig(proposer, int(k))
    points = [(c, v) for v in FLAGS.variants for c in ["none"] + [c for c in specs if c != "none"]]
    specs["none"] = None
    caches: dict = {}

    def run(point, max_new):
        _use(point[1], caches)
        rs = [
            decoding.generate(
                config, params, [p], max_new_tokens=max_new, speculative=specs[point[0]]
            )
            for p in prompts
        ]
        return sum(r.stats["run_s"] for r in rs), sum(sum(r.stats["steps"]) for r in rs)

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
    _use("full", caches)
    print(
        f"{FLAGS.checkpoint}: {config.num_layers} layers, H={config.hidden_size}; "
        f"{len(prompts)} prompts x {FLAGS.max_new_tokens} new tokens, median of {FLAGS.repeats}"
    )
    print(f"{'config':10s} {'variant':14s} {'ms/iter':>8s} {'plain steps':>12s} {'steps':>6s}")
    for v in FLAGS.variants:
        base = None
        for pt in [p for p in points if p[1] == v]:
            decode = statistics.median(full[pt]) - statistics.median(pre[pt])
            per = 1e3 * decode / steps[pt]
            base = base or per
            print(f"{pt[0]:10s} {v:14s} {per:8.3f} {per / base:12.2f} {steps[pt]:6d}")


if __name__ == "__main__":
    app.run(main)
