"""A speculative-decoding sweep measured in one process: every configuration against plain greedy,
timed round-robin, with the acceptance statistics and the cost pieces joined into one row each.

    points = [PLAIN] + [Point(p, k, c) for p in proposers for k in ks for c in commits]
    timed = sweep(config, params, prompts, points, max_new=128, repeats=4)
    rows = summarize(timed, pieces)          # pieces: {k: piece_costs(...)}

Timing: tokens/s = tokens ÷ device seconds of ``generate`` over the prompts at batch 1, compile
excluded; speedup = ratio to plain greedy's in the same run. The prefill part (prompt forward,
first token, proposer init) does not depend on the commit strategy: per (proposer, k) the same
program at max_new_tokens=1 is timed in the same round-robin, and decode time = run − prefill.
"""

from __future__ import annotations

import statistics
from typing import NamedTuple

from mtpspec import decoding
from mtpspec.analysis.model import fit_alpha, ideal_speedup
from mtpspec.analysis.timing import CompileCounter
from mtpspec.decoding.stats import pooled
from mtpspec.models.tree import TreeShape


class Point(NamedTuple):
    proposer: str  # "none" for plain decoding
    k: int
    commit: str | None
    linear: str = "auto"  # the decoding tree's linear implementation (``decoding.prepare``)
    tree: tuple[int, ...] | None = None  # a draft tree's branching (``SpecConfig.tree``)

    @property
    def program(self) -> tuple:
        """What the prefill part depends on (not the commit strategy)."""
        return (self.proposer, self.k, self.linear, self.tree)

    @property
    def nodes(self) -> int:
        """Draft tokens verified per step: k for a chain, every node of a tree."""
        return self.k if self.tree is None else TreeShape(self.tree).nodes


PLAIN = Point("none", 0, None)
PLAIN_XLA = Point("none", 0, None, "xla")  # plain greedy on XLA's own path: the kernels' baseline


def spec_for(point: Point, draft=None) -> decoding.SpecConfig | None:
    if point.proposer == "none":
        return None
    extra = {}
    if point.proposer == "draft":
        if draft is None:
            raise ValueError("proposer 'draft' needs a draft model (config, params)")
        extra = dict(draft_config=draft[0], draft_params=draft[1])
    return decoding.SpecConfig(point.proposer, point.k, point.commit, tree=point.tree, **extra)


def stock_attention(linear: str) -> str:
    """The attention implementation that goes with a swept ``linear``: "xla" with "xla" (the
    point is XLA's own path, nothing native), else "auto"."""
    return "xla" if linear == "xla" else "auto"


def run_point(
    config,
    params,
    prompts,
    spec,
    max_new: int,
    linear: str = "auto",
    attention: str | None = None,
    capacity_for: int | None = None,
):
    """One pass over the prompts at batch 1: (tokens per prompt, device seconds, stats list).
    ``attention`` None: ``stock_attention(linear)`` (``linear="xla"`` runs XLA's own path
    throughout). ``capacity_for``: give each prompt the KV capacity of a ``capacity_for``-token
    run (so a short run times the same state as a long one); None: the default for ``max_new``."""
    k = spec.num_draft if spec else 0
    results = [
        decoding.generate(
            config,
            params,
            [p],
            max_new_tokens=max_new,
            speculative=spec,
            linear=linear,
            attention=stock_attention(linear) if attention is None else attention,
            capacity=None
            if capacity_for is None
            else decoding.default_capacity(len(p), capacity_for, k),
        )
        for p in prompts
    ]
    seconds = sum(r.stats["run_s"] for r in results)
    return [r.tokens[0] for r in results], seconds, [r.stats for r in results]


class Timed(NamedTuple):
    points: list[Point]
    tokens: dict  # point -> tokens per prompt
    stats: dict  # point -> generate stats per prompt
    seconds: dict  # point -> device seconds per repeat
    prefill: dict  # Point.program -> median seconds of the prefill-only program
    compile_s: dict  # point -> seconds
    recompiles: int  # XLA compilations during the timed part (must be 0)
    num_prompts: int


def sweep(config, params, prompts, points, *, max_new: int, repeats: int, draft=None) -> Timed:
    """Warm up (compile) every point, then time them round-robin: every repeat runs every point
    once, so a noisy neighbour hurts all of them alike. Raises RuntimeError if a point's tokens
    change between runs."""
    specs = {pt: spec_for(pt, draft) for pt in points}
    tokens, stats, compile_s = {}, {}, {}
    for pt in points:
        tokens[pt], _, stats[pt] = run_point(config, params, prompts, specs[pt], max_new, pt.linear)
        compile_s[pt] = sum(s.get("compile_s", 0.0) for s in stats[pt])
    prefill_points = {}
    for pt in points:
        prefill_points.setdefault(pt.program, pt)
    for pt in prefill_points.values():
        run_point(config, params, prompts, specs[pt], 1, pt.linear)  # compile
    seconds = {pt: [] for pt in points}
    prefill = {key: [] for key in prefill_points}
    with CompileCounter() as counter:
        for _ in range(repeats):
            for pt in points:
                got, sec, _ = run_point(config, params, prompts, specs[pt], max_new, pt.linear)
                if got != tokens[pt]:
                    raise RuntimeError(f"{pt}: tokens changed between runs (nondeterminism)")
                seconds[pt].append(sec)
            for key, pt in prefill_points.items():
                prefill[key].append(run_point(config, params, prompts, specs[pt], 1, pt.linear)[1])
    prefill = {key: statistics.median(v) for key, v in prefill.items()}
    return Timed(
        list(points), tokens, stats, seconds, prefill, compile_s, counter.count, len(prompts)
    )


def throughput(timed: Timed, pt: Point) -> tuple[float, float]:
    """(end-to-end tok/s, decode tok/s); decode is NaN when prefill is >= 80 % of the run (too
    little generation to tell the loop's time apart from noise)."""
    seconds = statistics.median(timed.seconds[pt])
    total = sum(len(t) for t in timed.tokens[pt])
    decode_s = seconds - timed.prefill[pt.program]
    ok = decode_s > 0.2 * seconds
    return total / seconds, (total - timed.num_prompts) / decode_s if ok else float("nan")


def summarize(timed: Timed, pieces: dict, tree_windows: dict | None = None) -> list[dict]:
    """One row per speculative point: speed-ups against plain greedy with the same linear
    implementation in the same run (a ``Point("none", 0, None, linear)`` must be swept), pooled τ
    and per-position acceptance, the ideal speed-up from the pieces and the efficiency. A tree
    point's verify cost is its whole tree window ÷ step from ``tree_windows`` (``tree_costs``);
    its draft cost is not split out, so its ideal and efficiency are NaN."""
    rows = []
    for pt in timed.points:
        if pt.proposer == "none":
            continue
        plain = Point("none", 0, None, pt.linear)  # the baseline runs the same linear
        plain_tps, plain_decode = throughput(timed, plain)
        pc = dict(pieces.get(pt.k) or next(iter(pieces.values())))  # a tree's depth may be unswept
        acc = pooled(timed.stats[pt])
        tps, decode_tps = throughput(timed, pt)
        t_draft = pc.get(f"draft_{pt.proposer}", 0.0)
        ideal = ideal_speedup(acc["tau"], pc["step"], pc["verify"], t_draft)
        if pt.tree is not None:
            ratio = (tree_windows or {}).get(pt.tree, float("nan"))
            pc["verify"], t_draft, ideal = ratio * pc["step"], float("nan"), float("nan")
        rows.append(
            dict(
                proposer=pt.proposer,
                num_draft=pt.k,
                tree=pt.tree,
                nodes=pt.nodes,
                commit=pt.commit,
                tokens_per_s=tps,
                decode_tokens_per_s=decode_tps,
                speedup=tps / plain_tps,
                decode_speedup=decode_tps / plain_decode,
                prefill_s=timed.prefill[pt.program],
                tau=acc["tau"],
                position_acceptance=acc["position_acceptance"],
                verify_over_step=pc["verify"] / pc["step"],
                draft_over_step=t_draft / pc["step"],
                commit_over_verify=pc[f"commit_{pt.commit}"] / pc["verify"],
                ideal=ideal,
                efficiency=(decode_tps / plain_decode) / ideal,
                same_as_greedy=timed.tokens[pt] == timed.tokens[plain],
                compile_s=timed.compile_s[pt],
            )
        )
    return rows


def alpha_per_proposer(rows: list[dict]) -> dict[str, float]:
    """The i.i.d. acceptance rate fitted per proposer to every k's per-position acceptance."""
    proposers = sorted({r["proposer"] for r in rows})
    return {
        p: fit_alpha([r["position_acceptance"] for r in rows if r["proposer"] == p])
        for p in proposers
    }


def best(rows: list[dict]) -> dict:
    return max(rows, key=lambda r: r["speedup"])
