"""Which draft tree pays on this machine: rank acceptance, τ predicted for every tree shape, and a
bound on any tree's speed-up against the chains measured in the same run (``analysis.tree_plan``).

    python -m experiments.tree_plan                      # the shipped model, MTP, ~8 minutes
    python -m experiments.tree_plan --max_nodes=16 --json_out=/tmp/plan.json

In this one process:
  1. per-depth rank acceptance p_j(r) from a greedy run of the wide ``--rank_tree`` over the
     held-out demo prompts (``--rank_tokens`` each);
  2. τ̂ for every product tree (b_1, ..., b_d) with at most ``--max_nodes`` draft nodes inside the
     measuring tree;
  3. a timed sweep (``analysis.sweep``, round-robin): plain greedy, MTP chains k = 1..d and the
     trees on the Pareto front of (nodes, τ̂) — τ and decode / end-to-end speed-ups measured;
  4. verify windows ÷ a bare step (``analysis.tree_costs``): chains of 1..R rows (R: the largest
     tree's rows) and each timed tree;
  5. per tree the bound on its decode speed-up here and the flat-window what-if, and a verdict:
     whether any product tree within ``--max_nodes`` can be as fast as the best chain.
"""

from __future__ import annotations

import statistics

import jax
from absl import app, flags

from experiments import cli
from mtpspec import analysis, checkpoints, decoding
from mtpspec.analysis import tree_plan
from mtpspec.decoding.stats import pooled
from mtpspec.models.tree import TreeShape
from mtpspec.tokenizers import ByteTokenizer

FLAGS = flags.FLAGS
cli.define_checkpoint("Target model directory (with an MTP head).")
cli.define_json_out()
flags.DEFINE_string("rank_tree", "3x2x2x2x1x1", "The measuring tree (b1xb2x...): depth and ranks.")
flags.DEFINE_integer("rank_tokens", 512, "New tokens per prompt in the rank-acceptance run.")
flags.DEFINE_integer("max_nodes", 16, "Largest tree (draft nodes) considered.")
flags.DEFINE_integer("max_new_tokens", 128, "New tokens per prompt in the timed sweep.")
flags.DEFINE_integer("repeats", 3, "Timed round-robin repeats.")
flags.DEFINE_integer("time_trees", 8, "Trees of the (nodes, τ̂) Pareto front to time (largest τ̂).")
flags.DEFINE_integer("num_prompts", 4, "Held-out demo prompts to use (1..4).")


def pareto(shapes, acc) -> list[tuple[int, ...]]:
    """Trees whose τ̂ beats every tree with fewer nodes (the best τ̂ at each node count)."""
    best_at: dict[int, tuple[float, tuple]] = {}
    for b in shapes:
        n, tau = TreeShape(b).nodes, acc.tau(b)
        if n not in best_at or tau > best_at[n][0]:
            best_at[n] = (tau, b)
    front, top = [], 0.0
    for n in sorted(best_at):
        tau, b = best_at[n]
        if tau > top:
            front.append(b)
            top = tau
    return front


def main(argv):
    del argv
    config, params = checkpoints.load(FLAGS.checkpoint)
    if not config.mtp_num_layers:
        raise app.UsageError(f"{FLAGS.checkpoint} has no MTP head: trees are drafted by MTP")
    if config.vocab_size != ByteTokenizer.vocab_size or not 1 <= FLAGS.num_prompts <= 4:
        raise app.UsageError("the demo prompts need a byte-vocabulary model; --num_prompts 1..4")
    prompts = [ByteTokenizer().encode(t) for t in cli.demo_texts()[: FLAGS.num_prompts]]
    measuring = tuple(int(x) for x in FLAGS.rank_tree.split("x"))
    print(
        f"{FLAGS.checkpoint}: {config.num_layers} layers, H={config.hidden_size}; jax "
        f"{jax.__version__} on {jax.default_backend()}; {len(prompts)} prompts"
    )
    acc = tree_plan.rank_acceptance(
        config, params, prompts, measuring, max_new_tokens=FLAGS.rank_tokens
    )
    print(
        f"\nrank acceptance (greedy, measuring tree {FLAGS.rank_tree}, {acc.steps} steps, "
        f"τ {acc.measured_tau:.3f}):"
    )
    print(acc.table())

    shapes = tree_plan.product_trees(FLAGS.max_nodes, acc.depth, limit=acc.branching)
    timed_trees = pareto(shapes, acc)[-FLAGS.time_trees :]
    depth = acc.depth
    points = [analysis.PLAIN] + [analysis.Point("mtp", k, decoding.DEFAULT_COMMIT) for k in
                                 range(1, depth + 1)]  # fmt: skip
    points += [analysis.Point("mtp", len(t), decoding.DEFAULT_COMMIT, tree=t) for t in timed_trees]
    timed = analysis.sweep(
        config, params, prompts, points, max_new=FLAGS.max_new_tokens, repeats=FLAGS.repeats
    )
    plain_tps, plain_decode = analysis.throughput(timed, analysis.PLAIN)
    measured = {}
    for pt in points[1:]:
        tps, dec = analysis.throughput(timed, pt)
        same = timed.tokens[pt] == timed.tokens[analysis.PLAIN]
        tau = pooled(timed.stats[pt])["tau"]
        measured[pt.tree or pt.k] = dict(
            tau=tau, speedup=tps / plain_tps, decode_speedup=dec / plain_decode, same=same
        )
    if not all(m["same"] for m in measured.values()):
        raise RuntimeError("a speculative configuration emitted tokens that differ from greedy")

    rows_needed = max(TreeShape(b).rows for b in shapes)
    costs = analysis.tree_costs(config, params, prompts[0], timed_trees, chain_rows=rows_needed)
    step_ratio = costs["step_s"] * plain_decode  # a bare step ÷ plain decoding's time per token
    chains = {k: (measured[k]["tau"], measured[k]["decode_speedup"]) for k in range(1, depth + 1)}
    bounds = tree_plan.speed_bounds(acc, shapes, chains, costs["chain"], step_ratio)
    by_tree = {r["tree"]: r for r in bounds}

    print(f"\nplain greedy: {plain_tps:.1f} tok/s end to end, {plain_decode:.1f} decode")
    print(f"chain windows ÷ a bare step, t = 1..{rows_needed} rows:")
    print("  " + " ".join(f"{costs['chain'][t]:.2f}" for t in sorted(costs["chain"])))
    print(f"a bare step ÷ plain decoding's time per token (f): {step_ratio:.3f}")
    head = f"{'drafts':<14} {'nodes':>5} {'rows':>4} {'tau^':>6} {'tau':>6} {'decode':>7} "
    print(
        "\nmeasured (tau^: predicted from the rank acceptance; decode / e2e: speed-up over plain;"
    )
    print("bound: the most a tree's decode speed-up can be here; w/step: its window ÷ a step):")
    print(head + f"{'e2e':>6} {'bound':>6} {'w/step':>6}")
    for k in range(1, depth + 1):
        m = measured[k]
        print(
            f"{'chain k=' + str(k):<14} {k:>5} {k + 1:>4} {acc.tau((1,) * k):>6.2f} "
            f"{m['tau']:>6.2f} {m['decode_speedup']:>7.2f} {m['speedup']:>6.2f} {'':>6} "
            f"{costs['chain'][k + 1]:>6.2f}"
        )
    for t in timed_trees:
        m, r = measured[t], by_tree[t]
        print(
            f"{'tree ' + 'x'.join(map(str, t)):<14} {r['nodes']:>5} {r['rows']:>4} "
            f"{r['tau_hat']:>6.2f} {m['tau']:>6.2f} {m['decode_speedup']:>7.2f} "
            f"{m['speedup']:>6.2f} {r['bound']:>6.2f} {costs['tree'][t]:>6.2f}"
        )

    best_k = max(chains, key=lambda k: measured[k]["decode_speedup"])
    best_chain = measured[best_k]
    top = sorted(bounds, key=lambda r: -r["bound"])[:8]
    print(f"\nthe {len(top)} highest bounds of {len(bounds)} trees (≤ {FLAGS.max_nodes} nodes):")
    print(f"{'tree':<12} {'nodes':>5} {'rows':>4} {'tau^':>6} {'bound':>6} {'flat':>6}")
    for r in top:
        print(
            f"{'x'.join(map(str, r['tree'])):<12} {r['nodes']:>5} {r['rows']:>4} "
            f"{r['tau_hat']:>6.2f} {r['bound']:>6.2f} {r['flat']:>6.2f}"
        )
    flat = max(bounds, key=lambda r: r["flat"])
    tau_gain = max(r["tau_hat"] for r in bounds) - measured[3]["tau"] if depth >= 3 else None
    verdict = top[0]["bound"] < best_chain["decode_speedup"]
    print(
        f"\nbest chain: k={best_k}, decode {best_chain['decode_speedup']:.2f}x "
        f"(tau {best_chain['tau']:.2f}); highest tree bound: "
        f"{'x'.join(map(str, top[0]['tree']))} at {top[0]['bound']:.2f}x -> "
        + (
            "no product tree within the node budget can be as fast as the best chain here"
            if verdict
            else "a tree may be as fast as the best chain: time it"
        )  # fmt: skip
    )
    if tau_gain is not None:
        print(f"largest tau^ over chain k=3's measured tau: {tau_gain:+.2f}")
    print(
        f"flat-window what-if (window cost independent of rows): best tree "
        f"{'x'.join(map(str, flat['tree']))} at {flat['flat']:.2f}x decode against the best "
        f"chain's {best_chain['decode_speedup']:.2f}x (a model, not a measurement)"
    )
    cli.write_json({
        "rank_tree": list(acc.branching), "hits": acc.hits.tolist(),
        "reached": acc.reached.tolist(), "rank_steps": acc.steps,
        "rank_tau": acc.measured_tau, "plain_tokens_per_s": plain_tps,
        "plain_decode_tokens_per_s": plain_decode, "step_ratio": step_ratio,
        "chain_windows": {str(t): v for t, v in costs["chain"].items()},
        "tree_windows": {"x".join(map(str, t)): v for t, v in costs["tree"].items()},
        "measured": {(f"chain k={k}" if isinstance(k, int) else "x".join(map(str, k))): m
                     for k, m in measured.items()},
        "bounds": [{**r, "tree": list(r["tree"])} for r in bounds],
        "best_chain": {"k": best_k, **best_chain}, "no_tree_can_match": verdict,
        "repeats": FLAGS.repeats, "max_new_tokens": FLAGS.max_new_tokens,
        "seconds_median_plain": statistics.median(timed.seconds[analysis.PLAIN]),
    })  # fmt: skip


if __name__ == "__main__":
    app.run(main)
