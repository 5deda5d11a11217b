"""End-to-end decoding on a GPU: speed, speculation and exactness, on device.

    python -m experiments.gpu_decode --json_out=$OUT/gpu_decode.json   # GPU, ~4 minutes
    python -m experiments.gpu_decode --cpu_smoke                       # here: tiny, < 2 minutes

Two models, each in one round-robin sweep (``analysis.sweep``: every repeat runs every point once,
so a slow phase moves all of them alike):
  1. "default": the shipped default model (f32) on the held-out demo prompts: plain greedy, MTP
     k = 1..4 and n-gram k = 3; later (budget permitting) a second sweep of the longer chains
     against MTP trees, the ones the CPU's tree planner favours where windows are flat;
  2. "large": random weights of the Qwen3.5-0.8B shape (``config.qwen3_5_0_8b``, bf16; the
     vocabulary 248,320): plain greedy, MTP k = 2 and n-gram k = 3 (random weights accept almost
     nothing: what matters there is the cost of a window, not τ).
For each: end-to-end tok/s, decode tok/s (prefill subtracted), the speed-up over plain greedy in
the same run with its per-round IQR, τ, and **speculative tokens == plain greedy tokens** checked
for every point (the tokens come off the device; a mismatch is recorded with its first position,
never hidden). Then ``analysis.tree_costs``: a 1-token step and chain windows of 1..16 rows ÷ step
(on a GPU a window should cost about a step: flat in its rows), and for "large" the batch-1 step
against the HBM roofline: bytes a token must read (every weight the step uses: all but the MTP
layer; the tied embedding once, as the LM head) ÷ the copy bandwidth measured in this process.
A time budget skips what is left (marked "skipped", never dropped). Exit status 1 if any
speculative run differed from plain greedy.
"""

from __future__ import annotations

import json
import pathlib
import sys
import time

import jax
import jax.numpy as jnp
import numpy as np
from absl import flags

from experiments import cli
from mtpspec import analysis, checkpoints
from mtpspec import config as C
from mtpspec.analysis import pieces
from mtpspec.analysis.sweep import Point, round_speedup_iqr, throughput
from mtpspec.analysis.timing import median_seconds
from mtpspec.decoding.stats import pooled
from mtpspec.models import params as P

FLAGS = flags.FLAGS


def define_flags() -> None:
    """The tool's flags, defined only when it runs as a script (tests import ``run`` beside
    ``gpu_check``, whose flags share these names)."""
    flags.DEFINE_bool("cpu_smoke", False, "Tiny shapes and few tokens on CPU: checks the script.")
    flags.DEFINE_list("parts", ["default", "large"], "Which models to run: default, large.")
    flags.DEFINE_integer("max_new_tokens", 128, "New tokens per prompt in the timed sweeps.")
    flags.DEFINE_integer("repeats", 3, "Timed round-robin repeats per sweep.")
    flags.DEFINE_integer("window_rows", 16, "Time chain windows of 1..window_rows rows ÷ a step.")
    flags.DEFINE_float("budget_s", 300.0, "Skip what is left after this many seconds.")
    cli.define_json_out()


DEFAULT_POINTS = [Point("none", 0, None)] + [Point("mtp", k, "replay") for k in (1, 2, 3, 4)]
DEFAULT_POINTS += [Point("ngram", 3, "replay")]
# On the CPU the best chain was k = 5 or 6, and with windows flat in their rows the tree planner
# put 2x2x1x1 ahead of it (experiments/results/tree_plan.txt): the GPU is where to measure that.
TREES = [(2, 2, 1), (2, 2, 1, 1), (1, 1, 1, 1, 2)]
TREE_POINTS = [Point("none", 0, None)] + [Point("mtp", k, "replay") for k in (3, 4, 5, 6)]
TREE_POINTS += [Point("mtp", len(t), "replay", tree=t) for t in TREES]
LARGE_POINTS = [Point("none", 0, None), Point("mtp", 2, "replay"), Point("ngram", 3, "replay")]
COPY_BYTES = 1 << 32  # 4 GiB read + 4 GiB written: far beyond the L2
SMOKE = dict(max_new_tokens=12, repeats=2, window_rows=4, copy_bytes=1 << 24)


def copy_bandwidth(nbytes: int, repeats: int = 5) -> float:
    """Device memory bandwidth (bytes read + written per second) of an elementwise pass."""
    x = jax.random.uniform(jax.random.key(1), (nbytes // 4,), jnp.float32)
    f = jax.jit(lambda a: a * 1.0001 + 0.5)
    return 2 * nbytes / median_seconds(f, x, repeats=repeats, warmup=1)


def step_bytes(params) -> int:
    """Weight bytes one plain decode step reads: every parameter but the MTP layer (the tied
    embedding counted once: the LM head reads all of it, the lookup one row)."""
    return pieces.tree_bytes({k: v for k, v in params.items() if k != "mtp"})


def first_mismatch(a: list[list[int]], b: list[list[int]]):
    """(prompt, position) of the first differing token, None when equal."""
    for i, (x, y) in enumerate(zip(a, b, strict=True)):
        if x != y:
            n = next((j for j, (u, v) in enumerate(zip(x, y)) if u != v), min(len(x), len(y)))
            return [i, n]
    return None


def sweep_rows(config, params, prompts, points, cfg) -> tuple[list[dict], list[str]]:
    """One round-robin sweep: a row per point, and the exactness failures."""
    timed = analysis.sweep(
        config, params, prompts, points, max_new=cfg["max_new_tokens"], repeats=cfg["repeats"]
    )
    plain = points[0]
    e2e_plain, dec_plain = throughput(timed, plain)
    rows, failures = [], []
    for pt in points:
        e2e, dec = throughput(timed, pt)
        row = {
            "point": pt.label,
            "tokens": sum(map(len, timed.tokens[pt])),
            "e2e_tok_s": e2e,
            "decode_tok_s": dec,
            "compile_s": timed.compile_s[pt],
            "seconds": timed.seconds[pt],
        }
        if pt != plain:
            row["speedup_e2e"] = e2e / e2e_plain
            row["speedup_decode"] = dec / dec_plain
            row["speedup_e2e_iqr"] = list(round_speedup_iqr(timed, pt, plain))
            row["tau"] = pooled(timed.stats[pt])["tau"]
            bad = first_mismatch(timed.tokens[pt], timed.tokens[plain])
            row["equals_plain"] = bad is None
            if bad is not None:
                row["first_mismatch"] = bad
                failures.append(f"{pt.label} differs from plain greedy at prompt/position {bad}")
        rows.append(row)
    return rows, failures


def windows(config, params, prompt, rows: int, trees) -> dict:
    """A step's seconds, chain windows of 1..rows rows and ``trees``' windows ÷ step
    (``analysis.tree_costs``)."""
    costs = analysis.tree_costs(config, params, prompt, trees, chain_rows=rows, iters=32)
    return {
        "step_s": costs["step_s"],
        "plain_step_s": costs["plain_step_s"],
        "chain_window_over_step": {str(t): r for t, r in sorted(costs["chain"].items())},
        "tree_window_over_step": {"x".join(map(str, b)): r for b, r in costs["tree"].items()},
    }


def load_part(part: str, smoke: bool):
    """(config, params, prompts) of a part: "default" (the shipped model) or "large"."""
    if part == "default":
        config, params = checkpoints.load(cli.ASSETS / "default_model")
        return config, params, cli.bench_prompts(config, 2 if smoke else 4)
    if smoke:  # the 0.8B structure (tied, 3 GDN : 1 attention, bf16) at a tiny size
        config = C.qwen3_5_0_8b(vocab_size=512, hidden_size=64, intermediate_size=128,
                                layer_types=C.qwen3_5_0_8b().layer_types[:4],
                                mlp_types=("dense",) * 4, head_dim=16, linear_key_head_dim=16,
                                linear_value_head_dim=16, linear_num_key_heads=2,
                                linear_num_value_heads=2)  # fmt: skip
    else:
        config = C.qwen3_5_0_8b()
    return config, P.init_params(config, jax.random.key(0)), cli.bench_prompts(config, 2)


# In order; each task runs only while the budget lasts (the rest is marked "skipped").
TASKS = (
    ("default", "sweep", DEFAULT_POINTS),
    ("large", "sweep", LARGE_POINTS),
    ("large", "windows", None),
    ("large", "roofline", None),
    ("default", "windows", TREES),
    ("default", "trees", TREE_POINTS),
)


def run_task(models: dict, part: str, task: str, arg, cfg: dict, done: dict) -> dict:
    """One task's JSON-able result (and ``failures``, popped by the caller); ``done``: the
    part's results so far."""
    config, params, prompts = models[part]
    if task in ("sweep", "trees"):
        rows, failures = sweep_rows(config, params, prompts, arg, cfg)
        for row in rows:
            print(f"[{part} {task}] {json.dumps(row)}", flush=True)
        return {"rows": rows, "failures": failures}
    if task == "windows":
        out = windows(config, params, prompts[0], cfg["window_rows"], arg or [(1,)])
    else:  # roofline: a plain step (timed in "windows") against weight bytes ÷ bandwidth
        bw = copy_bandwidth(cfg["copy_bytes"])
        nbytes = step_bytes(params)
        timed = done.get("windows")
        step = timed["plain_step_s"] if isinstance(timed, dict) else float("nan")
        out = {
            "copy_bandwidth_GBps": bw / 1e9,
            "step_weight_bytes": nbytes,
            "roofline_step_s": nbytes / bw,
            "plain_step_s": step,
            "step_over_roofline": step / (nbytes / bw),
        }
    print(f"[{part} {task}] {json.dumps(out)}", flush=True)
    return out


def summary_table(result: dict) -> str:
    lines = [f"{'part':8} {'point':18} {'e2e tok/s':>10} {'speed-up (IQR)':>22} {'tau':>5} exact"]
    for part, res in result["parts"].items():
        for task in ("sweep", "trees"):
            sw = res.get(task)
            if sw is None:
                continue
            if not isinstance(sw, dict):
                lines.append(f"{part:8} {task}: {sw}")
                continue
            for r in sw["rows"]:
                sp, iqr = r.get("speedup_e2e"), r.get("speedup_e2e_iqr")
                sp_text = "" if sp is None else f"{sp:.2f}x ({iqr[0]:.2f}-{iqr[1]:.2f})"
                tau = "" if "tau" not in r else f"{r['tau']:.2f}"
                exact = str(r.get("equals_plain", ""))
                lines.append(f"{part:8} {r['point']:18} {r['e2e_tok_s']:10.1f} {sp_text:>22} "
                             f"{tau:>5} {exact}")  # fmt: skip
        w = res.get("windows")
        if isinstance(w, dict):
            ch = " ".join(f"{t}:{r:.2f}" for t, r in w["chain_window_over_step"].items())
            tr = " ".join(f"{t}:{r:.2f}" for t, r in w["tree_window_over_step"].items())
            lines.append(f"{part:8} step {w['step_s'] * 1e3:.3f} ms; window/step {ch}; trees {tr}")
        rf = res.get("roofline")
        if isinstance(rf, dict):
            lines.append(
                f"{part:8} roofline: {rf['step_weight_bytes'] / 1e9:.2f} GB at "
                f"{rf['copy_bandwidth_GBps']:.0f} GB/s = {rf['roofline_step_s'] * 1e3:.3f} ms; "
                f"plain step {rf['plain_step_s'] * 1e3:.3f} ms ({rf['step_over_roofline']:.2f}x)"
            )
    return "\n".join(lines)


def run(cfg: dict) -> dict:
    """Every task of ``TASKS`` for the parts in ``cfg["parts"]``, in order, within the budget."""
    started = time.perf_counter()
    result: dict = {
        "backend": jax.default_backend(),
        "device": jax.devices()[0].device_kind,
        "jax": jax.__version__,
        "parts": {},
        "failures": [],
    }
    models: dict = {}
    for part, task, arg in TASKS:
        if part not in cfg["parts"]:
            continue
        res = result["parts"].setdefault(part, {})
        if time.perf_counter() - started > cfg["budget_s"]:
            res[task] = "skipped (budget)"
            continue
        try:
            if part not in models:
                models[part] = load_part(part, cfg["cpu_smoke"])
                config, params, prompts = models[part]
                res["params"] = int(sum(np.prod(x.shape) for x in jax.tree.leaves(params)))
                res.update(dtype=config.dtype, vocab=config.vocab_size, prompts=len(prompts))
                print(f"[{part}] {res['params'] / 1e6:.1f}M params, {config.dtype}", flush=True)
            res[task] = run_task(models, part, task, arg, cfg, res)
            if isinstance(res[task], dict) and "failures" in res[task]:
                result["failures"] += res[task].pop("failures")
        except Exception as e:  # noqa: BLE001 - recorded and reported; the other tasks still run
            result["failures"].append(f"{part} {task}: {type(e).__name__}: {e}")
            res[task] = f"error: {type(e).__name__}: {e}"
            print(f"ERROR [{part} {task}] {type(e).__name__}: {e}", flush=True)
        result["elapsed_s"] = time.perf_counter() - started
        if cfg.get("json_out"):
            pathlib.Path(cfg["json_out"]).write_text(json.dumps(result, indent=1))
    return result


def main(argv):
    del argv
    cfg = dict(
        cpu_smoke=FLAGS.cpu_smoke,
        parts=FLAGS.parts,
        max_new_tokens=FLAGS.max_new_tokens,
        repeats=FLAGS.repeats,
        window_rows=FLAGS.window_rows,
        budget_s=FLAGS.budget_s,
        copy_bytes=COPY_BYTES,
        json_out=FLAGS.json_out,
    )
    if FLAGS.cpu_smoke:
        cfg.update(SMOKE)
    unknown = set(cfg["parts"]) - {"default", "large"}
    if unknown:
        raise ValueError(f"--parts takes default and large, got {sorted(unknown)}")
    result = run(cfg)
    print(summary_table(result))
    for f in result["failures"]:
        print(f"FAILED {f}")
    sys.exit(1 if result["failures"] else 0)


if __name__ == "__main__":
    define_flags()
    cli.run(main)
