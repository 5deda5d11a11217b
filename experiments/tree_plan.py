"""Which draft tree pays on this machine: rank acceptance, τ predicted for every tree shape, and a
ceiling on any tree's speed-up against the chains measured in the same run (``analysis.tree_plan``).

    python -m experiments.tree_plan                      # the shipped model, MTP, ~10 minutes
    python -m experiments.tree_plan --max_nodes=16 --json_out=/tmp/plan.json

In this one process:
  1. per-depth rank acceptance p_j(r) from a greedy run of the wide ``--tree`` over the
     held-out demo prompts (``--rank_tokens`` each);
  2. τ̂ for every product tree (b_1, ..., b_d) with at most ``--max_nodes`` draft nodes inside the
     measuring tree;
  3. a timed sweep (``analysis.sweep``, round-robin) of plain greedy and the MTP chains k = 1..d:
     τ and decode / end-to-end speed-ups; chain windows of 1..R rows ÷ a bare step
     (``analysis.tree_costs``; R: the largest tree's rows) and f, a bare step ÷ plain decoding's
     loop iteration, timed round-robin;
  4. per tree the bound on its decode speed-up here (τ̂ over a lower bound of its cost: the chain
     of its depth plus its extra window rows) and the flat-window what-if;
  5. a second sweep: plain greedy, every chain and the ``--time_trees`` trees with the highest
     ceilings, round-robin — the end-to-end verdict (best tree at least as fast as the best
     chain in the same run), beside the model's.
"""

from __future__ import annotations

import math

import jax
from absl import app, flags

from experiments import cli
from mtpspec import analysis, checkpoints, decoding
from mtpspec.analysis import tree_plan
from mtpspec.decoding.stats import pooled
from mtpspec.models.tree import TreeShape

FLAGS = flags.FLAGS
cli.define_checkpoint("Target model directory (with an MTP head).")
cli.define_json_out()
cli.define_tree(["2x2x2x2x2x2"], "The measuring tree (b1xb2x...), one: its depth and ranks.")
flags.DEFINE_integer(
    "rank_tokens", None, "New tokens per prompt in the rank-acceptance run (default: the sweep's)."
)
flags.DEFINE_integer("max_nodes", 16, "Largest tree (draft nodes) considered.")
flags.DEFINE_integer("max_new_tokens", 128, "New tokens per prompt in the timed sweep.")
flags.DEFINE_integer("repeats", 3, "Timed round-robin repeats.")
flags.DEFINE_integer("time_trees", 4, "Trees with the highest ceilings to time against the chains.")
flags.DEFINE_integer(
    "num_prompts", 4, "Held-out demo prompts to use (1..4; see cli.bench_prompts)."
)


def shape_text(branching) -> str:
    """A tree's branching as the flags write it: 2x1x1."""
    return "x".join(map(str, branching))


def name(key) -> str:
    """A configuration's label: an int k is the chain, a tuple a tree."""
    return f"chain k={key}" if isinstance(key, int) else "tree " + shape_text(key)


def timed_sweep(config, params, prompts, keys) -> dict:
    """Plain greedy and each configuration (chain k or tree), timed round-robin in one sweep:
    per key τ, end-to-end and decode speed-ups over plain greedy; plain's tok/s under None."""
    commit = decoding.DEFAULT_COMMIT
    points = [analysis.PLAIN] + [
        analysis.Point("mtp", k, commit) if isinstance(k, int)
        else analysis.Point("mtp", len(k), commit, tree=k)
        for k in keys
    ]  # fmt: skip
    timed = analysis.sweep(
        config, params, prompts, points, max_new=FLAGS.max_new_tokens, repeats=FLAGS.repeats
    )
    plain_tps, plain_decode = analysis.throughput(timed, analysis.PLAIN)
    out = {None: dict(tokens_per_s=plain_tps, decode_tokens_per_s=plain_decode)}
    for key, pt in zip(keys, points[1:], strict=True):
        if timed.tokens[pt] != timed.tokens[analysis.PLAIN]:
            raise RuntimeError(f"{name(key)} emitted tokens that differ from plain greedy")
        tps, dec = analysis.throughput(timed, pt)
        out[key] = dict(
            tau=pooled(timed.stats[pt])["tau"], speedup=tps / plain_tps,
            decode_speedup=dec / plain_decode,
        )  # fmt: skip
    return out


def print_verdict(final, best_k, candidates, top, model_chain, chain_model, finite, by_tree, depth):
    """The model's verdict, the measured one (end to end, one sweep), the τ line and the
    flat-window what-if. Returns whether the best timed tree was at least as fast as the chain."""
    best_tree = max(candidates, key=lambda t: final[t]["speedup"])
    wins = final[best_tree]["speedup"] >= final[best_k]["speedup"]
    ratio = top[0]["bound"] / model_chain["bound"]
    if ratio < 0.97:
        said = "no product tree within the node budget can be as fast as the best chain here"
    elif ratio <= 1.03:
        said = "a tie within the model's noise (±3 %): only the timed sweep can tell"
    else:
        said = "the ceiling does not rule trees out"
    print(
        f"\nmodel: best chain k={model_chain['nodes']} at {model_chain['bound']:.2f}x, highest "
        f"tree ceiling {shape_text(top[0]['tree'])} at {top[0]['bound']:.2f}x -> {said}"
    )
    print(
        f"measured, end to end: {name(best_tree)} {final[best_tree]['speedup']:.2f}x "
        f"vs chain k={best_k} {final[best_k]['speedup']:.2f}x -> "
        + ("the tree is at least as fast" if wins else "the chain is faster")
    )
    if depth >= 3:
        gain = max(r["tau_hat"] for r in finite) - by_tree[(1, 1, 1)]["tau_hat"]
        print(f"tau line (a tree of <= {FLAGS.max_nodes} nodes against chain k=3): "
              f"largest tau^ of a tree over chain k=3's tau^ {gain:+.2f}")  # fmt: skip
    flat_tree = max(finite, key=lambda r: r["flat"])
    flat_chain = max((r for r in chain_model if math.isfinite(r["flat"])), key=lambda r: r["flat"])
    print(
        "flat-window what-if (a window of any rows costing as much as one of two; a model, not a "
        f"measurement): best tree {shape_text(flat_tree['tree'])} at "
        f"{flat_tree['flat']:.2f}x, best chain k={flat_chain['nodes']} at {flat_chain['flat']:.2f}x"
    )
    return wins


def main(argv):
    del argv
    config, params = checkpoints.load(FLAGS.checkpoint)
    if not config.mtp_num_layers:
        raise app.UsageError(f"{FLAGS.checkpoint} has no MTP head: trees are drafted by MTP")
    prompts = cli.bench_prompts(config, FLAGS.num_prompts)
    measuring = cli.one(cli.trees(), "tree")
    print(
        f"{FLAGS.checkpoint}: {config.num_layers} layers, H={config.hidden_size}; jax "
        f"{jax.__version__} on {jax.default_backend()}; {len(prompts)} prompts × "
        f"{FLAGS.max_new_tokens} tokens, {FLAGS.repeats} round-robin repeats"
    )
    acc = tree_plan.rank_acceptance(
        config, params, prompts, measuring, max_new_tokens=FLAGS.rank_tokens or FLAGS.max_new_tokens
    )
    shown = shape_text(measuring)
    print(
        f"\nrank acceptance (greedy, measuring tree {shown}, {acc.steps} steps, "
        f"τ {acc.measured_tau:.3f}):"
    )
    print(acc.table())

    # 1. the chains: their measured cost per iteration is what every tree's bound starts from
    depth = acc.depth
    shapes = tree_plan.product_trees(FLAGS.max_nodes, acc.depth, limit=acc.branching)
    chains_run = timed_sweep(config, params, prompts, list(range(1, depth + 1)))
    rows_needed = max(TreeShape(b).rows for b in shapes)
    costs = analysis.tree_costs(config, params, prompts[0], [], chain_rows=rows_needed)
    step_ratio = costs["step_s"] / costs["plain_step_s"]  # a bare step ÷ a plain loop iteration
    chains = {k: (m["tau"], m["decode_speedup"]) for k, m in chains_run.items() if k}
    chain_shapes = [(1,) * k for k in range(1, depth + 1)]
    bounds = tree_plan.speed_bounds(acc, shapes, chains, costs["chain"], step_ratio)
    chain_model = tree_plan.speed_bounds(acc, chain_shapes, chains, costs["chain"], step_ratio)
    print(
        f"\nplain greedy: {chains_run[None]['tokens_per_s']:.1f} tok/s end to end, "
        f"{chains_run[None]['decode_tokens_per_s']:.1f} decode"
    )
    print(f"chain windows ÷ a bare step, t = 1..{rows_needed} rows:")
    print("  " + " ".join(f"{costs['chain'][t]:.2f}" for t in sorted(costs["chain"])))
    print(f"f, a bare step ÷ an iteration of plain decoding's loop: {step_ratio:.3f}")
    print("\nchains (tau^: predicted from the rank acceptance; decode / e2e: speed-up over plain;")
    print("model: tau^ / the measured cost per iteration):")
    print(f"{'drafts':<16} {'tau^':>6} {'tau':>6} {'decode':>7} {'e2e':>6} {'model':>6}")
    for k, r in zip(range(1, depth + 1), chain_model, strict=True):
        m = chains_run[k]
        print(f"{name(k):<16} {r['tau_hat']:>6.2f} {m['tau']:>6.2f} {m['decode_speedup']:>7.2f} "
              f"{m['speedup']:>6.2f} {r['bound']:>6.2f}")  # fmt: skip

    # 2. every tree's ceiling; the highest ones timed against the best chain in one sweep
    finite = [r for r in bounds if math.isfinite(r["bound"])]  # NaN: prefill swamped a chain
    if not finite or not any(math.isfinite(r["bound"]) for r in chain_model):
        raise RuntimeError("no finite decode speed-up: generate more tokens (--max_new_tokens)")
    top = sorted(finite, key=lambda r: -r["bound"])
    print(f"\nthe 10 highest ceilings of {len(bounds)} trees (≤ {FLAGS.max_nodes} nodes; "
          f"{len(bounds) - len(finite)} without one; bound: the estimated most its decode "
          "speed-up can be here; flat: if windows cost as much at any rows):")  # fmt: skip
    print(f"{'tree':<14} {'nodes':>5} {'rows':>4} {'tau^':>6} {'bound':>6} {'flat':>6}")
    for r in top[:10]:
        print(
            f"{shape_text(r['tree']):<14} {r['nodes']:>5} {r['rows']:>4} "
            f"{r['tau_hat']:>6.2f} {r['bound']:>6.2f} {r['flat']:>6.2f}"
        )
    model_chain = max(
        (r for r in chain_model if math.isfinite(r["bound"])), key=lambda r: r["bound"]
    )
    candidates = [r["tree"] for r in top[: FLAGS.time_trees]]
    final = timed_sweep(config, params, prompts, [*chains, *candidates])
    best_k = max(chains, key=lambda k: final[k]["speedup"])  # the verdict compares end to end
    tree_windows = analysis.tree_costs(config, params, prompts[0], candidates)["tree"]
    print(f"\nevery chain and the {len(candidates)} highest-ceiling trees, one sweep:")
    print(f"{'drafts':<16} {'nodes':>5} {'tau^':>6} {'tau':>6} {'decode':>7} {'e2e':>6} "
          f"{'bound':>6} {'w/step':>6}")  # fmt: skip
    by_tree = {r["tree"]: r for r in bounds + chain_model}
    for key in [*chains, *candidates]:
        r, m = by_tree[(1,) * key if isinstance(key, int) else key], final[key]
        w = costs["chain"][key + 1] if isinstance(key, int) else tree_windows[key]
        print(
            f"{name(key):<16} {r['nodes']:>5} {r['tau_hat']:>6.2f} {m['tau']:>6.2f} "
            f"{m['decode_speedup']:>7.2f} {m['speedup']:>6.2f} {r['bound']:>6.2f} {w:>6.2f}"
        )
    wins = print_verdict(final, best_k, candidates, top, model_chain, chain_model, finite, by_tree,
                         depth)  # fmt: skip
    label = lambda d: {("plain" if k is None else name(k)): v for k, v in d.items()}  # noqa: E731
    cli.write_json({
        "rank_tree": list(acc.branching), "hits": acc.hits.tolist(),
        "reached": acc.reached.tolist(), "rank_steps": acc.steps, "rank_tau": acc.measured_tau,
        "step_ratio": step_ratio, "chain_windows": {str(t): v for t, v in costs["chain"].items()},
        "tree_windows": {shape_text(t): v for t, v in tree_windows.items()},
        "chains": label(chains_run), "final": label(final),
        "bounds": [{**r, "tree": list(r["tree"])} for r in bounds],
        "chain_model": [{**r, "tree": list(r["tree"])} for r in chain_model],
        "bound_rules_trees_out": top[0]["bound"] < model_chain["bound"],
        "best_tree_at_least_as_fast": wins,
        "settings": dict(max_new_tokens=FLAGS.max_new_tokens, repeats=FLAGS.repeats,
                         rank_tree=shown, max_nodes=FLAGS.max_nodes,
                         prompts=len(prompts), jax=jax.__version__),
    })  # fmt: skip


if __name__ == "__main__":
    cli.run(main)
