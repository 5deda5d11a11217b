"""The tree planner (``analysis.tree_plan``): τ of a tree from rank acceptance against a Monte Carlo
of greedy tree acceptance, the rank counts against the loop's own accepted counts, the tree
enumeration against its definition, the speed bound's arithmetic, and the refusals."""

from __future__ import annotations

import functools
import itertools
import json
import math
import pathlib
import subprocess
import sys

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import mtpspec
from mtpspec import config as C
from mtpspec import decoding, models
from mtpspec.analysis import tree_plan
from mtpspec.decoding import program, stages
from mtpspec.decoding import window as dwindow
from mtpspec.models.tree import TreeShape

ROOT = pathlib.Path(__file__).resolve().parent.parent


def _monte_carlo_tau(shape, p, n, seed):
    """Greedy acceptance (``decoding.window.accept_greedy``) of n random trees where, at depth j,
    the target's token is the path node's rank-r child with probability p[j][r] (none of the
    drafted children with the rest), independently of the ranks above: the mean of n."""
    tree = TreeShape(shape)
    d, rows, vocab = tree.depth, tree.rows, 16
    rng = np.random.default_rng(seed)
    # true tokens 1..d (depth j's is j + 1); every other draft and off-path target: d + 1..15
    tokens = rng.integers(d + 1, vocab, size=(n, rows))
    tokens[:, 0] = 0
    target = rng.integers(d + 1, vocab, size=(n, rows))
    node, alive, seqs = np.zeros(n, np.int64), np.ones(n, bool), np.arange(n)
    for j, b in enumerate(shape):
        target[seqs[alive], node[alive]] = j + 1  # the target's token after the path so far
        probs = np.append(p[j], 1.0 - np.sum(p[j]))  # the last: not among the ranked drafts
        rank = rng.choice(len(probs), size=n, p=probs)
        hit = alive & (rank < b)
        child = tree.first_child[node] + np.minimum(rank, b - 1)
        tokens[seqs[hit], child[hit]] = j + 1
        node, alive = np.where(hit, child, node), hit
    logits = jax.nn.one_hot(target, vocab)
    node, _ = dwindow.accept_greedy(tree, logits, jnp.asarray(tokens, jnp.int32))
    return float(np.mean(tree.row_depth[np.asarray(node)] + 1))


@pytest.mark.parametrize(
    "shape, p",
    [
        ((1, 1, 1), [[0.9], [0.8], [0.7]]),
        ((2, 2, 1), [[0.6, 0.2], [0.5, 0.3, 0.1], [0.7]]),
        ((3, 1), [[0.3, 0.25, 0.2], [0.6]]),
        ((2, 2, 2), [[0.5, 0.4], [0.45, 0.45], [0.2, 0.1]]),
    ],
)
def test_tau_of_a_tree_matches_a_monte_carlo_of_greedy_acceptance(shape, p):
    """The formula against the loop's own acceptance rule on 40k random trees (±4 SE)."""
    n = 40_000
    want = _monte_carlo_tau(shape, p, n, seed=sum(shape))
    got = tree_plan.tree_tau(p, shape)
    assert abs(got - want) < 4 * math.sqrt(len(shape) / n) + 1e-3, (got, want)
    # a rank wider than the tree is not counted: the formula uses exactly b_j ranks
    assert got < tree_plan.tree_tau([[*x, 0.05] for x in p], [b + 1 for b in shape])


@pytest.fixture(scope="module")
def small_model():
    config = C.tiny_hybrid(vocab_size=8, layer_types=(C.LINEAR, C.FULL), mlp_types=("dense",) * 2)
    return config, models.init_params(config, jax.random.key(8), norm_scale=0.1)


PROMPTS = [[1, 2, 3, 4, 5, 6, 7, 1, 2, 3], [5, 3], [7]]


def test_a_one_wide_measuring_tree_counts_what_the_chain_loop_accepts(small_model):
    """Tree (1, 1, 1) verifies as chain k = 3 does: its rank-0 hits at depth j are exactly the
    chain run's steps that accepted more than j drafts, every step counted."""
    config, params = small_model
    max_new = 24
    acc = tree_plan.rank_acceptance(config, params, PROMPTS, (1, 1, 1), max_new_tokens=max_new)
    chain = mtpspec.generate(
        config, params, PROMPTS, max_new_tokens=max_new,
        speculative=decoding.SpecConfig("mtp", 3, decoding.DEFAULT_COMMIT),
    )  # fmt: skip
    steps = np.asarray([a for seq in chain.stats["accepted"] for a in seq if a >= 0])
    assert acc.steps == len(steps) and acc.accepted == steps.sum()
    assert acc.measured_tau == pytest.approx(1 + steps.mean())
    np.testing.assert_array_equal(acc.hits[:, 0], [(steps > j).sum() for j in range(3)])
    np.testing.assert_array_equal(acc.reached, [(steps >= j).sum() for j in range(3)])
    assert 0 < acc.accepted < 3 * acc.steps  # some steps accepted, some missed


def test_child_ranks_walk_the_path():
    tree = TreeShape((3, 2))  # rows: 0 | 1 2 3 | 4 5 (of 1) 6 7 (of 2) 8 9 (of 3)
    want = {0: [], 1: [0], 2: [1], 3: [2], 4: [0, 0], 5: [0, 1], 6: [1, 0], 7: [1, 1], 9: [2, 1]}
    for node, ranks in want.items():
        assert tree_plan.child_ranks(tree, node) == ranks, node


def test_every_recorded_rank_is_the_child_that_carries_the_target_token(small_model):
    """An oracle apart from ``Carry.node``: step the same n-gram tree program, recompute each
    step's drafts (integer code: exactly the loop's) and walk plain greedy's continuation down
    the tree; the per-depth rank counts must be rank_acceptance's, ranks past the first included."""
    config, params = small_model
    shape, max_new = TreeShape((3, 2)), 24
    prompts = [[1, 2, 3, 1, 2, 4, 1, 2, 5, 1, 2], [3, 3, 3, 6, 3, 3, 7, 3], [7]]
    acc = tree_plan.rank_acceptance(
        config, params, prompts, shape, max_new_tokens=max_new, proposer="ngram"
    )
    truth = mtpspec.generate(config, params, prompts, max_new_tokens=max_new + 4).tokens
    spec = decoding.SpecConfig("ngram", 2, decoding.DEFAULT_COMMIT, tree=shape.branching)
    prep = decoding.prepare(config, params, prompts, max_new_tokens=max_new, speculative=spec)

    @functools.partial(jax.jit, static_argnums=0)
    def propose(s, params, pparams, c):  # what program.step proposes from this carry
        draws = c.draws.fold(c.step).fold(program.PROPOSE)
        active = c.stop == stages.RUNNING
        return s.proposer.propose(
            s, params, pparams, c.pstate, c.state, c.pending, active, draws
        ).drafts

    hits, reached = np.zeros_like(acc.hits), np.zeros_like(acc.reached)
    c = prep.prefill()
    while (np.asarray(c.stop) == stages.RUNNING).any() and int(c.step) < prep.key.out_size:
        running = np.flatnonzero(np.asarray(c.stop) == stages.RUNNING)
        drafts, count = np.asarray(propose(prep.key, *prep.args[:2], c)), np.asarray(c.count)
        tokens = np.concatenate([np.asarray(c.pending)[:, None], drafts], axis=1)
        for i in running:
            node, future = 0, truth[i][count[i] :]  # the target's tokens after the root
            for j, b in enumerate(shape.branching):
                reached[j] += 1
                first = shape.first_child[node]
                match = np.flatnonzero(tokens[i, first : first + b] == future[j])
                if match.size == 0:
                    break
                hits[j, match[0]] += 1
                node = first + int(match[0])
        c = prep.step(c)
    np.testing.assert_array_equal(acc.hits, hits)
    np.testing.assert_array_equal(acc.reached, reached)
    assert hits[:, 1:].sum() > 0  # second and third choices were accepted too


def test_a_wide_measuring_tree_gives_back_its_own_tau(small_model):
    """Counts telescope: τ predicted for the measuring tree itself is the run's τ; every depth's
    children's hits are the next depth's reached steps."""
    config, params = small_model
    acc = tree_plan.rank_acceptance(config, params, PROMPTS, (3, 2), max_new_tokens=24)
    assert acc.reached[0] == acc.steps > 0
    assert acc.hits[0].sum() == acc.reached[1]
    assert acc.tau((3, 2)) == pytest.approx(acc.measured_tau, abs=1e-12)
    assert acc.hits[0, 1:].sum() > 0  # a rank past the first was accepted somewhere
    assert acc.tau((1, 1)) <= acc.tau((2, 1)) <= acc.tau((3, 2))
    text = acc.table()
    assert text.count("\n") == 2 and "q(b)" in text


def test_predictions_outside_the_measuring_tree_are_refused(small_model):
    acc = tree_plan.RankAcceptance((2, 1), np.array([[5, 2], [3, 0]]), np.array([10, 7]), 10, 10)
    assert acc.tau((2, 1)) == pytest.approx(1 + 0.7 + 0.7 * 3 / 7)
    for bad in [(3,), (2, 2), (1, 1, 1)]:
        with pytest.raises(ValueError, match="outside the measuring tree"):
            acc.tau(bad)
    never = tree_plan.RankAcceptance((1, 1), np.array([[0], [0]]), np.array([4, 0]), 4, 0)
    with pytest.raises(ValueError, match="never reached"):
        never.p(1)
    assert never.tau((1, 1)) == never.measured_tau == 1.0  # nothing past the root was accepted
    with pytest.raises(ValueError, match="too small"):
        tree_plan.tree_tau([[0.5]], (2,))
    config, params = small_model
    with pytest.raises(ValueError, match="greedy"):
        tree_plan.rank_acceptance(config, params, PROMPTS, (2,), max_new_tokens=8, temperature=1.0)


@pytest.mark.parametrize("max_nodes, max_depth, limit", [(6, 3, None), (16, 4, (3, 3, 2, 2))])
def test_product_trees_are_every_shape_within_the_budget(max_nodes, max_depth, limit):
    got = tree_plan.product_trees(max_nodes, max_depth, limit=limit)
    want = set()
    for d in range(1, max_depth + 1):
        for b in itertools.product(range(1, max_nodes + 1), repeat=d):
            ok = limit is None or all(x <= m for x, m in zip(b, limit, strict=False))
            nodes = sum(math.prod(b[: i + 1]) for i in range(d))
            if ok and nodes <= max_nodes and any(x > 1 for x in b):
                want.add(b)
    assert set(got) == want and len(got) == len(want)
    assert [TreeShape(b).nodes for b in got] == sorted(TreeShape(b).nodes for b in got)
    with_chains = tree_plan.product_trees(max_nodes, max_depth, limit=limit, chains=True)
    assert set(with_chains) - set(got) == {(1,) * d for d in range(1, max_depth + 1)}
    with pytest.raises(ValueError, match="max_nodes"):
        tree_plan.product_trees(0, 2)
    with pytest.raises(ValueError, match="shorter"):
        tree_plan.product_trees(4, 3, limit=(2, 2))


def test_the_speed_bound_adds_the_extra_rows_to_the_chains_iteration():
    acc = tree_plan.RankAcceptance((2, 1), np.array([[6, 2], [5, 0]]), np.array([10, 8]), 10, 9)
    chains = {1: (1.6, 1.2), 2: (2.1, 1.4)}  # k -> (τ, decode speed-up)
    windows = {1: 1.0, 2: 1.1, 3: 1.2, 4: 1.3, 5: 1.45}
    (row,) = tree_plan.speed_bounds(acc, [(2, 1)], chains, windows, step_ratio=0.9)
    tau = 1 + 0.8 + 0.8 * 5 / 8
    c_chain = 2.1 / 1.4  # plain steps per iteration of chain k = 2
    assert row["tau_hat"] == pytest.approx(tau)
    assert row["bound"] == pytest.approx(tau / (c_chain + 0.9 * (1.45 - 1.2)))
    assert row["flat"] == pytest.approx(tau / (c_chain - 0.9 * (1.2 - 1.1)))
    (chain,) = tree_plan.speed_bounds(acc, [(1, 1)], chains, windows, step_ratio=0.9)
    assert chain["bound"] == pytest.approx(acc.tau((1, 1)) / c_chain)  # no extra rows
    assert (row["nodes"], row["rows"]) == (4, 5)
    with pytest.raises(ValueError, match="no chain of depth"):
        tree_plan.speed_bounds(acc, [(2, 1)], {1: (1.6, 1.2)}, windows, 0.9)
    dip = {**windows, 5: 1.15}  # a measured dip below the 3-row window: the extra rows cost 0
    (row,) = tree_plan.speed_bounds(acc, [(2, 1)], chains, dip, step_ratio=0.9)
    assert row["bound"] == pytest.approx(tau / c_chain)
    with pytest.raises(ValueError, match=r"no chain window of \[2, 5\] rows"):
        tree_plan.speed_bounds(acc, [(2, 1)], chains, {1: 1.0, 3: 1.2}, 0.9)
    with pytest.raises(ValueError, match="step_ratio"):
        tree_plan.speed_bounds(acc, [(2, 1)], chains, windows, 0.0)


@pytest.mark.slow(60)
def test_the_tree_plan_script_writes_its_json(tmp_path):
    """experiments/tree_plan.py end to end on a small checkpoint: the rank run, both sweeps (every
    configuration's tokens equal plain greedy's, or the script raises), bounds for every tree.
    160 new tokens: a run whose decode is under 20 % of it has no decode speed (NaN), which a
    noisy prefill timing caused at 64 (a fresh clone, 2026-12-07)."""
    out = tmp_path / "plan.json"
    cmd = [
        sys.executable, "-m", "experiments.tree_plan", "--checkpoint=tests/fixtures/hf/qwen3_5",
        "--tree=2x2", "--max_nodes=4", "--max_new_tokens=160", "--repeats=1",
        "--time_trees=1", "--num_prompts=2", f"--json_out={out}",
    ]  # fmt: skip
    proc = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr[-3000:]
    result = json.loads(out.read_text())
    assert result["rank_tree"] == [2, 2] and result["rank_steps"] > 0
    acc = tree_plan.RankAcceptance(
        (2, 2), np.array(result["hits"]), np.array(result["reached"]), result["rank_steps"], 0
    )
    assert acc.tau((2, 2)) == pytest.approx(result["rank_tau"])  # the counts telescope
    shapes = {tuple(r["tree"]) for r in result["bounds"]}
    assert shapes == {(2,), (1, 2), (2, 1)}  # (2, 2) has 6 nodes: over the budget
    for r in result["bounds"]:
        assert r["tau_hat"] >= 1.0 and r["bound"] > 0 and r["flat"] > 0
    assert set(result["chains"]) == {"plain", "chain k=1", "chain k=2"}
    final = set(result["final"])  # plain, both chains and the tree with the highest ceiling
    assert {"plain", "chain k=1", "chain k=2"} < final and len(final) == 4
    assert isinstance(result["best_tree_at_least_as_fast"], bool)
    assert set(result["chain_windows"]) == {"1", "2", "3", "4", "5"}  # (2, 1): 5 rows
