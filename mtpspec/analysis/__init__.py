"""Speculative-decoding analysis: timing, cost pieces, sweeps, the acceptance model, plots.

Shared by ``experiments/bench_speculative.py`` and the notebooks, so that a figure in a notebook
and a number in the benchmark come from the same code. Definitions (docs/design.md, "Performance
model"):

  * t_step: one 1-token decode step of the target (the work plain decoding does per token);
  * t_verify(k): one (k+1)-token verify window of the target;
  * t_draft(k): one proposal of k drafts plus the proposer's update after an accepted window;
  * ideal speed-up = τ · t_step / (t_verify + t_draft); efficiency = measured ÷ ideal;
  * the i.i.d. acceptance model: E[τ] = (1 − α^{k+1}) / (1 − α).

  timing.py   median_seconds, interleaved_medians, loop_job, CompileCounter, MachineLoad,
              matmul_row_scaling
  pieces.py   piece_costs: step, verify, commit per strategy, draft per proposer;
              layer_costs: attention / GDN / MLP / LM head of a step and of verify windows
  sweep.py    sweep / summarize: every configuration against plain greedy in one run;
              per_round_speedup (median, IQR); self_checks / quick_checks: why a run is no result
  model.py    ideal_speedup, expected_tau, fit_alpha
  hlo.py      loop_copies: the buffer copies XLA put in a decoding program's loop body
  quantization.py  weights_report: what opt-in int8 weights change (KL, top-1, τ)
  plots.py    plot_sweep
  trees.py    tree_costs (tree window ÷ step beside chains), plot_nodes (τ, speed-up vs nodes)
  tree_plan.py  rank_acceptance (p_j(r) measured in the loop), tree_tau (τ of any tree shape),
              product_trees, speed_bounds (an estimated ceiling on a tree's speed-up here)
"""

from mtpspec.analysis.hlo import loop_copies
from mtpspec.analysis.model import expected_tau, fit_alpha, ideal_speedup
from mtpspec.analysis.pieces import PIECES, layer_costs, piece_costs, tree_bytes
from mtpspec.analysis.plots import plot_sweep
from mtpspec.analysis.sweep import (
    PLAIN,
    PLAIN_XLA,
    Point,
    Timed,
    adaptive_points,
    alpha_per_proposer,
    best,
    memory_report,
    per_round_speedup,
    quick_checks,
    run_point,
    self_checks,
    spec_for,
    stock_attention,
    summarize,
    sweep,
    throughput,
)
from mtpspec.analysis.timing import (
    CompileCounter,
    MachineLoad,
    interleaved_medians,
    loop_job,
    matmul_row_scaling,
    median_seconds,
)
from mtpspec.analysis.tree_plan import (
    RankAcceptance,
    product_trees,
    rank_acceptance,
    speed_bounds,
    tree_tau,
)
from mtpspec.analysis.trees import plot_nodes, tree_costs, tree_table

__all__ = [
    "adaptive_points",
    "memory_report",
    "PIECES",
    "PLAIN",
    "PLAIN_XLA",
    "CompileCounter",
    "MachineLoad",
    "Point",
    "RankAcceptance",
    "Timed",
    "alpha_per_proposer",
    "best",
    "expected_tau",
    "fit_alpha",
    "ideal_speedup",
    "interleaved_medians",
    "layer_costs",
    "loop_copies",
    "loop_job",
    "matmul_row_scaling",
    "median_seconds",
    "piece_costs",
    "product_trees",
    "rank_acceptance",
    "plot_nodes",
    "plot_sweep",
    "run_point",
    "self_checks",
    "per_round_speedup",
    "quick_checks",
    "spec_for",
    "speed_bounds",
    "stock_attention",
    "summarize",
    "sweep",
    "throughput",
    "tree_bytes",
    "tree_costs",
    "tree_table",
    "tree_tau",
]
