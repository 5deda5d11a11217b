"""Tree speculation measured beside chains: what a tree window costs against a decode step and a
chain window, and τ / speed-up against the number of draft nodes verified per step.

    ratios = tree_costs(config, params, prompt, [(2, 1, 1), (2, 2, 1)], iters=64)
    # {"step_s": s, "chain": {t: window ÷ step}, "tree": {(2, 1, 1): tree window ÷ step, ...}}
    plot_nodes(rows, path)     # rows of ``sweep.summarize`` (chains and trees)

Each window runs inside one jitted on-device loop on the decoding tree of weights (the same fused
projections and linear implementation decoding uses, ``linear``), after a prefill of ``prompt``,
all round-robin (``timing.interleaved_medians``).
"""

from __future__ import annotations

from collections.abc import Sequence

import jax.numpy as jnp

from mtpspec import decoding
from mtpspec.analysis.timing import interleaved_medians, loop_job
from mtpspec.decoding import backend, program
from mtpspec.models import decoder
from mtpspec.models import tree as mtree


def tree_costs(
    config, params, prompt, shapes: Sequence[tuple], *, iters=64, linear="auto", chain_rows=0
):
    """Seconds of a 1-token step, and window ÷ step for chains of t = 1 .. max(deepest tree + 1,
    ``chain_rows``) rows (each with the GDN form decoding runs for t rows) and for each tree; and
    ``plain_step_s``, one iteration of plain decoding's own loop body (``program.step``: the step
    with its sampling, emit and stop checks), timed in the same round-robin."""
    shapes = [mtree.check_tree(x) for x in shapes]
    longest = max([s.depth + 1 for s in shapes] + [chain_rows])
    rows = max([t.rows for t in shapes] + [longest])
    prep = decoding.prepare(config, params, [list(prompt)], max_new_tokens=16, linear=linear,
                            capacity=len(prompt) + rows + 16)  # fmt: skip
    tree_params = prep.args[0]
    state = prep.prefill().state
    vocab = config.vocab_size

    def job(forward, t):  # one t-row window per iteration, its next input from its output
        def body(c, tok):
            p, st = c
            out = forward(p, st, jnp.full((1, t), tok, jnp.int32))
            last = jnp.argmax(out.logits[0, -1]) if out.ids is None else out.ids[0, -1]
            return (last % vocab).astype(jnp.int32)

        return loop_job(body, (tree_params, state), jnp.int32(1), iters=iters)

    def chain(t):
        method = backend.window_gdn_method(config, "auto", t, sharded=False)
        valid = jnp.array([t], jnp.int32)
        return job(
            lambda p, st, x: decoder.window_step_impl(
                config, p, st, x, valid, method, argmax_only=decoder.screened_head(p)
            ),
            t,
        )

    def tree(shape):  # with the GDN form decoding runs for it (stages.verify)
        valid = jnp.array([shape.rows], jnp.int32)
        method = backend.window_gdn_method(config, "auto", shape.depth + 1, sharded=False)
        return job(
            lambda p, st, x: decoder.window_step_impl(
                config, p, st, x, valid, method, tree=shape, argmax_only=decoder.screened_head(p)
            ),
            shape.rows,
        )

    plain = decoding.prepare(config, params, [list(prompt)], max_new_tokens=iters + 8,
                             linear=linear)  # fmt: skip
    pp, ppp, _, _, max_new, eos, _, _ = plain.args

    def plain_body(consts, c):
        return program.step(plain.key, *consts, c)

    consts = (pp, ppp, max_new, eos)
    jobs = {("plain", 0): loop_job(plain_body, consts, plain.prefill(), iters=iters)}
    jobs.update({("chain", t): chain(t) for t in range(1, longest + 1)})
    jobs.update({("tree", s.branching): tree(s) for s in shapes})
    med = interleaved_medians(jobs)
    step = med[("chain", 1)]
    return {
        "step_s": step / iters,
        "plain_step_s": med[("plain", 0)] / iters,
        "chain": {t: s / step for (kind, t), s in med.items() if kind == "chain"},
        "tree": {b: s / step for (kind, b), s in med.items() if kind == "tree"},
    }


def plot_nodes(rows: Sequence[dict], path: str, *, title: str = ""):
    """τ and end-to-end speed-up against draft nodes verified per step, chains and trees of one
    proposer's rows (``summarize``: keys nodes, tree, tau, speedup). Writes a PNG."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (ax_t, ax_s) = plt.subplots(1, 2, figsize=(11, 4.2))
    for kind, marker in (("chain", "o-"), ("tree", "s")):
        pts = sorted(
            (r for r in rows if (r.get("tree") is None) == (kind == "chain")),
            key=lambda r: r["nodes"],
        )
        if not pts:
            continue
        xs = [r["nodes"] for r in pts]
        ax_t.plot(xs, [r["tau"] for r in pts], marker, label=kind)
        ax_s.plot(xs, [r["speedup"] for r in pts], marker, label=kind)
        if kind == "tree":
            for r in pts:
                name = "x".join(map(str, r["tree"]))
                ax_t.annotate(name, (r["nodes"], r["tau"]), fontsize=7)
                ax_s.annotate(name, (r["nodes"], r["speedup"]), fontsize=7)
    ax_t.set_xlabel("draft nodes verified per step")
    ax_t.set_ylabel("τ (tokens per verify step)")
    ax_s.set_xlabel("draft nodes verified per step")
    ax_s.set_ylabel("speed-up over plain greedy (end to end)")
    ax_s.axhline(1.0, color="gray", lw=0.8)
    for ax in (ax_t, ax_s):
        ax.legend(fontsize=8)
    if title:
        fig.suptitle(title, fontsize=9)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return fig


def tree_table(rows: Sequence[dict], costs: dict) -> str:
    """The tree rows of a sweep beside the chain rows of the same proposer, as text: nodes, τ,
    speed-ups, and the window ÷ step of each (the chain's window of k + 1 rows)."""
    lines = [
        f"{'drafts':<14} {'nodes':>5} {'tau':>5} {'speedup':>8} {'decode':>6} {'w/step':>6}  same"
    ]
    for r in sorted(rows, key=lambda r: (r["tree"] is not None, r["nodes"])):
        if r["tree"] is None:
            name, ratio = f"chain k={r['num_draft']}", costs["chain"].get(r["num_draft"] + 1)
        else:
            name, ratio = "tree " + "x".join(map(str, r["tree"])), costs["tree"][r["tree"]]
        w = "-" if ratio is None else f"{ratio:.2f}"
        lines.append(
            f"{name:<14} {r['nodes']:>5} {r['tau']:>5.2f} {r['speedup']:>8.2f} "
            f"{r['decode_speedup']:>6.2f} {w:>6}  {r['same_as_greedy']}"
        )
    return "\n".join(lines)
