"""Which model shape makes speculation pay on this machine? Issue 18's shape question, measured.

    python -m experiments.investigations.shape_sweep --shapes=6x128,8x256,12x256,12x384,16x384 \
        --num_draft=2,3

For each shape LxH (``config.default_like(L, H)``: L layers, full attention every third like the
default model, hidden H, heads of 32 / 64 dims sized from H, dense MLP 3H, byte vocabulary or
each of ``--vocabs`` (what a BPE tokenizer's LM head would cost), one MTP layer; random weights:
the costs do not depend on what the weights are),
``analysis.piece_costs`` times, in one process and round-robin, a one-token ``step``, a
(k+1)-token ``verify`` window, the ``replay`` commit and ``draft_mtp`` (k MTP drafts + the
update), on the post-prefill state of a 64-token prompt with generate's capacity. Printed per
shape and k: parameters, step time, r(k+1) = verify / step, draft cost per draft in steps, and
the *projected* speed-up

    τ(k) / ((verify + commit + draft_mtp) / step)

with τ(k) from ``--tau`` (default: the first default model's (6 × 128) held-out τ, k=1: 1.80,
k=2: 2.13, k=3: 2.23 — `python -m experiments.acceptance --num_draft=1,2,3 --proposer=mtp`).
A projection: a deeper model's own head may accept more or less, and a BPE vocabulary changes
τ too (the byte model's τ is applied to every ``--vocabs`` size unchanged); the costs are
measured.
"""

from __future__ import annotations

import jax
from absl import app, flags

from experiments import cli
from mtpspec import config as C
from mtpspec import decoding
from mtpspec.analysis.pieces import piece_costs
from mtpspec.models.params import init_params, param_shapes

FLAGS = flags.FLAGS
cli.define_json_out()
flags.DEFINE_list("shapes", "6x128,8x256,12x256,12x384,16x384", "LAYERSxHIDDEN shapes.")
flags.DEFINE_list("num_draft", "2,3", "k values.")
flags.DEFINE_list("tau", "1:1.80,2:2.13,3:2.23", "k:τ pairs used for the projection.")
flags.DEFINE_integer("prompt_len", 64, "Prompt tokens before the timed state.")
flags.DEFINE_integer("repeats", 7, "Round-robin repeats per piece (medians).")
flags.DEFINE_list("vocabs", "256", "Vocabulary sizes (256: bytes; larger: what a BPE would cost).")


def count(config) -> int:
    import math

    shapes = param_shapes(config)
    return sum(
        math.prod(s)
        for s in jax.tree.leaves(shapes, is_leaf=lambda x: isinstance(x, tuple) and all(
            isinstance(d, int) for d in x))
    )  # fmt: skip


def main(argv):
    del argv
    taus = {int(a): float(b) for a, b in (p.split(":") for p in FLAGS.tau)}
    ks = [int(k) for k in FLAGS.num_draft]
    vocab_min = min(int(v) for v in FLAGS.vocabs)
    if vocab_min < 64:
        raise app.UsageError(f"--vocabs: sizes below 64 are not useful here, got {vocab_min}")
    prompt = [(7 * i + 3) % min(200, vocab_min - 32) + 32 for i in range(FLAGS.prompt_len)]
    rows = []
    print(f"{'shape':>8} {'vocab':>6} {'params':>8} {'k':>2} {'step ms':>8} {'r(k+1)':>7} "
          f"{'draft/step':>10} {'commit/step':>11} {'projected':>9}")  # fmt: skip
    shapes = [(s, int(v)) for s in FLAGS.shapes for v in FLAGS.vocabs]
    for s, vocab in shapes:
        layers, hidden = (int(x) for x in s.lower().split("x"))
        config = C.default_like(layers, hidden, vocab_size=vocab)
        params = init_params(config, jax.random.key(0), norm_scale=0.1)
        for k in ks:
            cap = decoding.default_capacity(len(prompt), 128, k)
            res = piece_costs(
                config, params, prompt, k, proposers=("mtp",), commits=("replay",),
                repeats=FLAGS.repeats, capacity=cap,
            )  # fmt: skip
            step, verify = res["step"], res["verify"]
            draft, commit = res["draft_mtp"], res["commit_replay"]
            cost = (verify + commit + draft) / step
            proj = taus[k] / cost if k in taus else float("nan")
            row = dict(shape=s, vocab=vocab, params=count(config), k=k, step_s=step,
                       r=verify / step,
                       draft_per_draft=draft / step / k, commit=commit / step,
                       projected_speedup=proj, tau=taus.get(k))  # fmt: skip
            rows.append(row)
            print(
                f"{s:>8} {vocab:>6} {row['params'] / 1e6:>7.2f}M {k:>2} {step * 1e3:>8.3f} "
                f"{row['r']:>7.2f} "
                f"{draft / step:>10.2f} {commit / step:>11.3f} {proj:>8.2f}x"
            )
    cli.write_json(rows)


if __name__ == "__main__":
    cli.run(main)
