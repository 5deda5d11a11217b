"""Which draft tree to verify: per-depth rank acceptance measured in the decoding loop, τ predicted
for any tree shape from it, and a ceiling on what a tree's speed-up can be on this machine.

    acc = rank_acceptance(config, params, prompts, (2, 2, 2, 2), max_new_tokens=128)
    acc.tau((2, 2, 1))                          # predicted τ of a (2, 2, 1) tree
    shapes = product_trees(16, acc.depth, limit=acc.branching)
    rows = speed_bounds(acc, shapes, chains, windows, step_ratio)

The model (Sequoia's positional acceptance, for greedy verification): at depth j, given that the
path to its parent at depth j − 1 was accepted, the target's token is the parent's rank-r child
(children ordered as the proposer ranks them: MTP's top-b, most likely first) with probability
p_j(r), whatever the ranks above it. A tree of branching (b_1, ..., b_d) then reaches depth j
with probability Π_{i≤j} q_i(b_i), q_i(b) = Σ_{r<b} p_i(r), and

    τ = 1 + Σ_j Π_{i≤j} q_i(b_i)            (a chain: every b_i = 1)

``rank_acceptance`` measures p_j(r) for r < b_j with one wide tree: the row each verify step of
the loop accepted (``Carry.node``) gives the rank of every child on its path; per depth pooled
over every step that reached it. For the measuring tree itself the formula gives back the run's
τ exactly (telescoping counts); for other shapes it is a prediction, to be checked against their
measured τ (``experiments/tree_plan.py`` prints both).

``speed_bounds``: a tree of depth d and R rows does all a depth-d chain's iteration does (propose
d levels, verify, commit, update) and verifies R − d − 1 more rows. A chain window of t rows costs
w(t) bare decode steps (``tree_costs``), and a tree window costs at least a chain window of as many
rows (measured: ``tree_costs``' tree and chain columns), so in plain decoding's loop iterations

    C_tree ≥ C_chain(d) + f · max(0, w(R) − w(d + 1)),   C_chain(d) = τ_d / decode speed-up_d,

f = a bare step ÷ an iteration of plain decoding's loop (they run different code: a one-row
window against the decode step with its sampling and emit, so f may exceed 1). τ̂ / that is an
estimated ceiling on the tree's decode speed-up: its extra drafting rows and the tree forms' own
overheads are left out (optimistic), but τ̂ and the measured C_chain and w carry their own noise,
so read a ceiling within a few per cent of a chain's as a tie. For a chain (all b_j = 1) it is
τ̂ / C_chain(d), the chain's measured speed-up with its τ replaced by τ̂, so trees and chains
compare through one model. ``flat`` is the what-if of a machine where a window costs as much at
any number of rows as at two (a GPU's regime far into the tens of rows), for trees and chains
alike: τ̂ / (C_chain(d) − f · max(0, w(d + 1) − w(2))).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterable, Sequence

import numpy as np

from mtpspec import decoding
from mtpspec.decoding import stages
from mtpspec.models.tree import MAX_ROWS, TreeShape, check_tree
from mtpspec.sharding import to_host


@dataclasses.dataclass(frozen=True)
class RankAcceptance:
    """Counts from one greedy run of a measuring tree of branching ``branching``:
    ``hits[j, r]`` steps whose target token at depth j + 1 was the rank-r child of the node the
    path had reached, ``reached[j]`` steps whose path reached depth j (the root: every step)."""

    branching: tuple[int, ...]
    hits: np.ndarray  # [d, max b] int
    reached: np.ndarray  # [d] int
    steps: int
    accepted: int  # drafts accepted over all steps (the loop's own count)

    @property
    def depth(self) -> int:
        return len(self.branching)

    @property
    def measured_tau(self) -> float:
        """The run's τ: 1 + drafts accepted per step."""
        return 1.0 + self.accepted / self.steps

    def p(self, j: int) -> np.ndarray:
        """p_{j+1}(r) for r < b_{j+1} (0-based depth j): the rank-r child's share of the steps that
        reached depth j."""
        if self.reached[j] == 0:
            raise ValueError(f"depth {j} was never reached in the measuring run")
        return self.hits[j, : self.branching[j]] / self.reached[j]

    def tau(self, branching: Sequence[int]) -> float:
        """Predicted τ of a tree of this branching (a chain: all ones). ValueError for a tree
        deeper or wider at some depth than the measuring tree."""
        b = check_tree(tuple(branching)).branching
        if len(b) > self.depth or any(x > m for x, m in zip(b, self.branching, strict=False)):
            raise ValueError(
                f"tree {b} is outside the measuring tree {self.branching}: its acceptance "
                "at that depth and rank was not measured"
            )
        # a depth no step reached adds nothing: the reach to it is already 0
        p = [self.p(j) if self.reached[j] else np.zeros(b[j]) for j in range(len(b))]
        return tree_tau(p, b)

    def table(self) -> str:
        """p_j(r) as text, one line per depth."""
        lines = [f"{'depth':>5} {'reached':>8}  p(rank 1, 2, ...)   q(b) = p summed over ranks < b"]
        for j in range(self.depth):
            p = self.p(j) if self.reached[j] else np.full(self.branching[j], np.nan)
            ps = " ".join(f"{x:.3f}" for x in p)
            qs = " ".join(f"{x:.3f}" for x in np.cumsum(p))
            lines.append(f"{j + 1:>5} {int(self.reached[j]):>8}  {ps:<19} {qs}")
        return "\n".join(lines)


def tree_tau(p: Sequence[Sequence[float]], branching: Sequence[int]) -> float:
    """τ = 1 + Σ_j Π_{i≤j} q_i(b_i) for rank acceptance ``p[i][r]`` (depth i + 1, rank r; at
    least b_{i+1} ranks per depth): the expected tokens per greedy verify step of the tree."""
    if len(p) < len(branching) or any(len(p[i]) < b for i, b in enumerate(branching)):
        raise ValueError(f"rank acceptance of shape {[len(x) for x in p]} is too small for tree "
                         f"{tuple(branching)}")  # fmt: skip
    reach, tau = 1.0, 1.0
    for i, b in enumerate(branching):
        reach *= float(np.sum(p[i][:b]))
        tau += reach
    return tau


def child_ranks(tree, node: int) -> list[int]:
    """The rank (0: the proposer's first choice) of each child on the path root → ``node``: one
    per depth 1..depth(node). Children of a node are consecutive rows in the proposer's order."""
    shape = check_tree(tree)
    rows = shape.path[node, : int(shape.row_depth[node]) + 1]
    return [int(rows[j + 1] - shape.first_child[rows[j]]) for j in range(len(rows) - 1)]


def rank_acceptance(
    config,
    params,
    prompts: list[list[int]],
    tree,
    *,
    max_new_tokens: int,
    proposer: str = "mtp",
    commit: str | None = None,
    **prepare_kw,
) -> RankAcceptance:
    """Run greedy tree speculation with the measuring ``tree`` over ``prompts`` (one batch), one
    verify step at a time from Python (``Prepared.prefill`` / ``step``: the loop's own jitted
    functions), and count at each depth which ranked child the accepted path took — read off the
    row each step accepted (``Carry.node``), so every verify step counts, the last one of a
    sequence too (its emission may be cut short by the length; its verification is not)."""
    shape = check_tree(tree)
    spec = decoding.SpecConfig(
        proposer, shape.depth, commit or decoding.DEFAULT_COMMIT, tree=shape.branching
    )
    prep = decoding.prepare(
        config, params, prompts, max_new_tokens=max_new_tokens, speculative=spec, **prepare_kw
    )
    if not prep.key.sampling.greedy:
        raise ValueError("rank_acceptance measures greedy verification; pass temperature 0")
    hits = np.zeros((shape.depth, max(shape.branching)), np.int64)
    reached = np.zeros(shape.depth, np.int64)
    steps = accepted_total = 0
    c = prep.prefill()
    for step in range(prep.key.out_size):  # the carry's own step counter, kept on the host
        running = np.flatnonzero(to_host(c.stop)[: prep.n] == stages.RUNNING)
        if running.size == 0:
            break
        c = prep.step(c)
        node, accepts = to_host(c.node), to_host(c.accepts)[step]
        for i in running:
            ranks = child_ranks(shape, int(node[i]))
            if len(ranks) != accepts[i]:
                raise RuntimeError(
                    f"step {step}, sequence {i}: node {node[i]} is at depth {len(ranks)} but the "
                    f"loop counted {accepts[i]} accepted"
                )
            for j, r in enumerate(ranks):
                reached[j] += 1
                hits[j, r] += 1
            if len(ranks) < shape.depth:  # the next depth was tried and missed
                reached[len(ranks)] += 1
            steps += 1
            accepted_total += len(ranks)
    if steps == 0:
        raise ValueError("no verify step ran: give longer outputs (max_new_tokens)")
    return RankAcceptance(shape.branching, hits, reached, steps, accepted_total)


def product_trees(
    max_nodes: int, max_depth: int, *, limit: Sequence[int] | None = None, chains: bool = False
) -> list[tuple[int, ...]]:
    """Every branching (b_1, ..., b_d), d ≤ ``max_depth``, with at most ``max_nodes`` draft nodes
    (and ``MAX_ROWS`` rows), each b_j ≤ ``limit[j]`` when given; chains (all ones) only with
    ``chains``. Sorted by node count, then lexicographically."""
    if max_nodes < 1 or max_depth < 1:
        raise ValueError(f"max_nodes and max_depth must be >= 1, got {max_nodes}, {max_depth}")
    if limit is not None and len(limit) < max_depth:
        raise ValueError(f"limit {tuple(limit)} is shorter than max_depth {max_depth}")
    out = []

    def grow(prefix: tuple[int, ...], level: int, nodes: int):  # level: nodes at the last depth
        if prefix and (chains or any(x > 1 for x in prefix)):
            out.append(prefix)
        j = len(prefix)
        if j == max_depth:
            return
        cap = max_nodes if limit is None else int(limit[j])
        for b in range(1, cap + 1):
            more = nodes + level * b
            if more > max_nodes or more + 1 > MAX_ROWS:
                break  # wider only adds nodes
            grow((*prefix, b), level * b, more)

    grow((), 1, 0)
    return sorted(out, key=lambda b: (TreeShape(b).nodes, b))


def speed_bounds(
    acc: RankAcceptance,
    shapes: Iterable[Sequence[int]],
    chains: dict[int, tuple[float, float]],
    windows: dict[int, float],
    step_ratio: float,
) -> list[dict]:
    """Per tree: predicted τ̂, the estimated ceiling on its decode speed-up here and the
    flat-window what-if (module docstring). ``chains``: k -> (τ, decode speed-up) measured in the
    same run; ``windows``: rows t -> a chain window of t rows ÷ a bare step (``tree_costs``);
    ``step_ratio``: f, a bare step ÷ plain decoding's time per token. Trees deeper than the
    longest chain or with more rows than ``windows`` measured raise ValueError."""
    if not 0 < step_ratio <= 1.5:
        raise ValueError(f"step_ratio (a bare step ÷ a plain token's time) is off: {step_ratio}")
    rows = []
    for b in shapes:
        shape = check_tree(tuple(b))
        d, r = shape.depth, shape.rows
        if d not in chains:
            raise ValueError(f"tree {shape.branching}: no chain of depth {d} was measured")
        missing = [t for t in sorted({2, d + 1, r}) if t not in windows]
        if missing:
            raise ValueError(f"tree {shape.branching}: no chain window of {missing} rows measured")
        tau_d, speed_d = chains[d]
        c_chain = tau_d / speed_d
        tau = acc.tau(shape.branching)
        # more rows never cost less: a dip in the measured w is noise
        cost = c_chain + step_ratio * max(0.0, windows[r] - windows[d + 1])
        flat = c_chain - step_ratio * max(0.0, windows[d + 1] - windows[min(2, d + 1)])
        rows.append(
            dict(
                tree=shape.branching,
                nodes=shape.nodes,
                rows=r,
                tau_hat=tau,
                bound=tau / cost,
                flat=tau / flat,
            )
        )
    return rows


__all__ = [
    "RankAcceptance",
    "child_ranks",
    "product_trees",
    "rank_acceptance",
    "speed_bounds",
    "tree_tau",
]
