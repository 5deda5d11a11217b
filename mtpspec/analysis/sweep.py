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
    p_min: float = 0.0  # ``SpecConfig.p_min``: drafting stops below this confidence
    adaptive: bool = False  # ``SpecConfig.adaptive``: each sequence's own draft length

    @property
    def adapts(self) -> bool:
        """The draft length adapts per step (its window is k + 1 rows at most)."""
        return self.p_min > 0 or self.adaptive

    @property
    def variant(self) -> str:
        """ "" for fixed k, else what adapts: "p>=0.3", "adaptive", "adaptive p>=0.3"."""
        parts = (["adaptive"] if self.adaptive else []) + (
            [f"p>={self.p_min:g}"] if self.p_min > 0 else []
        )
        return " ".join(parts)

    @property
    def label(self) -> str:
        """ "plain greedy", "mtp k=3", "mtp tree 2x2", "mtp k=3 adaptive p>=0.3"."""
        if self.proposer == "none":
            return "plain greedy"
        shape = f"tree {'x'.join(map(str, self.tree))}" if self.tree else f"k={self.k}"
        return f"{self.proposer} {shape}" + (f" {self.variant}" if self.variant else "")

    @property
    def program(self) -> tuple:
        """What the prefill part depends on (not the commit strategy)."""
        return (self.proposer, self.k, self.linear, self.tree, self.adapts)

    @property
    def nodes(self) -> int:
        """Draft tokens verified per step: k for a chain, every node of a tree."""
        return self.k if self.tree is None else TreeShape(self.tree).nodes


PLAIN = Point("none", 0, None)
PLAIN_XLA = Point("none", 0, None, "xla")  # plain greedy on XLA's own path: the kernels' baseline


def adaptive_points(proposers, ks, commit, linear, p_min, adaptive: bool) -> list[Point]:
    """``p_min`` (strings or numbers in (0, 1)) for every k and proposer with probabilities
    (mtp, draft); with ``adaptive``, the policy at the largest k, alone and with each p_min."""
    try:
        cuts = [float(x) for x in p_min]
    except ValueError as e:
        raise ValueError(f"p_min must be numbers in (0, 1): {e}") from None
    if any(not 0 < x < 1 for x in cuts):
        raise ValueError(f"p_min must be numbers in (0, 1), got {list(p_min)}")
    scored = [p for p in proposers if p in ("mtp", "draft")]
    points = [Point(p, k, commit, linear, p_min=x) for p in scored for k in ks for x in cuts]
    if adaptive:
        k = max(ks)
        points += [Point(p, k, commit, linear, adaptive=True) for p in proposers]
        points += [
            Point(p, k, commit, linear, p_min=x, adaptive=True) for p in scored for x in cuts
        ]
    return points


def spec_for(point: Point, draft=None) -> decoding.SpecConfig | None:
    if point.proposer == "none":
        return None
    extra = {}
    if point.proposer == "draft":
        if draft is None:
            raise ValueError("proposer 'draft' needs a draft model (config, params)")
        extra = dict(draft_config=draft[0], draft_params=draft[1])
    return decoding.SpecConfig(
        point.proposer, point.k, point.commit, tree=point.tree, p_min=point.p_min,
        adaptive=point.adaptive, **extra,
    )  # fmt: skip


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
    its draft cost is not split out, so its ideal and efficiency are NaN. So are an adaptive
    point's (``Point.adapts``: its window varies per step); its ``verify_over_step`` is the
    longest window's and ``mean_drafted`` the drafts its windows held on average."""
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
        if pt.adapts:
            ideal = float("nan")
        drafted = [d for st in timed.stats[pt] for seq in st["drafted"] for d in seq if d >= 0]
        rows.append(
            dict(
                proposer=pt.proposer,
                num_draft=pt.k,
                tree=pt.tree,
                nodes=pt.nodes,
                commit=pt.commit,
                p_min=pt.p_min,
                adaptive=pt.adaptive,
                variant=pt.variant,
                mean_drafted=statistics.fmean(drafted) if drafted else 0.0,
                tokens_per_s=tps,
                decode_tokens_per_s=decode_tps,
                speedup=tps / plain_tps,
                speedup_iqr=round_speedup_iqr(timed, pt, plain),
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


def per_round_speedup(point_s, plain_s, token_ratio: float = 1.0) -> tuple[float, float, float]:
    """(median, first quartile, third quartile) of the per-round speed-ups: round i's point
    (``point_s[i]`` seconds for ``token_ratio`` × plain's tokens) against plain's round i
    (round-robin, so a slow phase moves both)."""
    if len(point_s) != len(plain_s) or not point_s:
        raise ValueError(f"need as many rounds of each (>= 1), got {len(point_s)}, {len(plain_s)}")
    per_round = [token_ratio * p / s for s, p in zip(point_s, plain_s)]
    if len(per_round) < 2:
        return per_round[0], per_round[0], per_round[0]
    q1, q2, q3 = statistics.quantiles(per_round, n=4, method="inclusive")
    return q2, q1, q3


def round_speedup_iqr(timed: Timed, pt: Point, plain: Point) -> tuple[float, float]:
    """(first, third) quartile of the per-round end-to-end speed-up (``per_round_speedup``)."""
    ratio = sum(map(len, timed.tokens[pt])) / sum(map(len, timed.tokens[plain]))
    return per_round_speedup(timed.seconds[pt], timed.seconds[plain], ratio)[1:]


def quick_checks(rows: list[dict], recompiles: int) -> list[str]:
    """``self_checks`` for a run that times no pieces (``make demo``): why its figures are not a
    result (empty: none found). Rows: plain first, then ``name``, ``tokens``, ``speedup``,
    ``tau`` per speculative configuration (greedy). Fires for tokens that differ from plain
    greedy's, a speed-up above τ (a verify window costs at least a step, so none can exceed
    τ), and compiles during the timed rounds."""
    found = [f"{recompiles} compiles during the timed rounds"] if recompiles else []
    base = rows[0]
    for r in rows[1:]:
        if r["tokens"] != base["tokens"]:
            found.append(f"{r['name']}: tokens differ from plain greedy")
        if r["speedup"] > r["tau"]:
            found.append(f"{r['name']}: speed-up {r['speedup']:.2f} above its tau {r['tau']:.2f}")
    return found


EFFICIENCY_RANGE = (0.8, 1.1)
PLAIN_LOOP_SLACK = 1.1  # the plain loop's time per token may exceed its step piece by 10 %


def self_checks(rows: list[dict], plain_decode_tps: float, t_step: float) -> list[str]:
    """Why a sweep's figures cannot be trusted as a result (empty: none found). Each check is
    physics a valid run obeys: a chain's efficiency (measured decode speed-up ÷ the pieces' ideal)
    within ``EFFICIENCY_RANGE``; no decode speed-up above τ ÷ r(k+1), r the verify window ÷ step
    (a window cannot emit more than τ tokens per window's time); the plain loop's time per decoded
    token (1 ÷ ``plain_decode_tps``) at most ``PLAIN_LOOP_SLACK`` × its own step piece
    ``t_step`` (a slower plain loop is a handicapped baseline that inflates every speed-up).
    Trees (no split-out draft cost) get only the τ ÷ r check; adaptive rows (windows of 1..k + 1
    rows) only τ ÷ 1 (a window costs at least a step); NaN figures are skipped."""
    lo, hi = EFFICIENCY_RANGE
    found = []
    plain_token_s = 1.0 / plain_decode_tps
    if plain_token_s > PLAIN_LOOP_SLACK * t_step:
        found.append(
            f"plain loop {plain_token_s * 1e3:.3f} ms/token is {plain_token_s / t_step:.2f}x its "
            f"step piece ({t_step * 1e3:.3f} ms; allowed {PLAIN_LOOP_SLACK:.2f}x)"
        )
    for r in rows:
        name = (
            f"{r['proposer']} k={r['num_draft']} {r['commit']}"
            if r["tree"] is None
            else "mtp tree " + "x".join(map(str, r["tree"]))
        )
        if r.get("variant"):
            name += " " + r["variant"]
        eff, bound = r["efficiency"], r["tau"] / r["verify_over_step"]
        if r.get("variant"):  # its windows may be shorter than the longest one's r
            bound = r["tau"]
        if r["tree"] is None and eff == eff and not lo <= eff <= hi:
            found.append(f"{name}: efficiency {eff:.2f} outside [{lo}, {hi}]")
        if r["decode_speedup"] > bound:
            found.append(
                f"{name}: decode speed-up {r['decode_speedup']:.2f} above tau / r = "
                f"{r['tau']:.2f} / {r['verify_over_step']:.2f} = {bound:.2f}"
            )
    return found


def alpha_per_proposer(rows: list[dict]) -> dict[str, float]:
    """The i.i.d. acceptance rate fitted per proposer to every k's per-position acceptance."""
    proposers = sorted({r["proposer"] for r in rows})
    return {
        p: fit_alpha([r["position_acceptance"] for r in rows if r["proposer"] == p])
        for p in proposers
    }


def best(rows: list[dict]) -> dict:
    return max(rows, key=lambda r: r["speedup"])


def memory_report(pieces, k, commits) -> dict:
    memory = {
        "state_bytes": pieces[k]["state_bytes"],
        "k": k,
        **{
            s: {
                "commit_data_bytes": pieces[k][f"commit_data_bytes_{s}"],
                "verify_commit_temp_bytes": pieces[k][f"step_temp_bytes_{s}"],
            }
            for s in commits
        },
    }
    mem = ", ".join(
        f"{s}: commit data {memory[s]['commit_data_bytes'] / 1024:.1f} KiB, temp "
        f"{(memory[s]['verify_commit_temp_bytes'] or 0) / 1024:.1f} KiB"
        for s in commits
    )
    print(f"memory (k={k}): decode state {memory['state_bytes'] / 1024:.1f} KiB; {mem}")
    return memory
