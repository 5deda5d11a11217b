"""Speculative decoding sweep: every proposer × commit strategy × k against plain greedy, one run.

    python -m experiments.bench_speculative --quick --json_out=/tmp/bench.json --plot_dir=/tmp/plots
    python -m experiments.bench_speculative --checkpoint=DIR --num_draft=1,2,4,6 --proposer=ngram
    python -m experiments.bench_speculative --peer_hf=on     # with the `hf` extra installed

On the default model (or any checkpoint), in this one process (``mtpspec.analysis``):
  * plain greedy and each configuration, timed round-robin (``analysis.sweep``): tokens/s over the
    held-out demo prompts at batch 1, compile excluded; speedup = ratio to plain greedy;
  * τ (tokens per verify step), per-position acceptance, whether the tokens equal plain greedy;
  * the jitted cost pieces (``analysis.piece_costs``): verify window over one step, commit over
    verify, draft cost; the ideal speedup τ·t_step/(t_verify+t_draft) and efficiency = measured ÷
    ideal (docs/design.md, "Performance model");
  * ``recompiles``: XLA compilations during the timed part (must be 0);
  * the per-round speed-up's IQR, the CPU share other processes took; self-checks
    (``analysis.self_checks``: efficiency outside [0.8, 1.1], decode speed-up above τ ÷ r(k+1),
    plain loop > 1.1 × its step piece, recompiles) mark the run INVALID instead of a best;
  * the linear implementations side by side (``decoding.prepare(linear=...)``): plain greedy
    on XLA's own path (attention too) as a point of the same sweep; the verify window ÷ step
    r(t) for t = 2..``--max_window`` and the per-piece decomposition (attention, GDN, MLP, LM
    head, rest) of the step and of each swept window, for "xla" and the C++ kernel, timed
    round-robin (``analysis.layer_costs``);
  * decode-state bytes and the commit data / XLA temp bytes of verify+commit per strategy;
  * α fitted per proposer to the per-position acceptance, and the theory curve (1−α^{k+1})/(1−α);
  * the buffer copies XLA left in each decoding program's loop body (``analysis.loop_copies``);
  * optionally (``--peer_hf``) HF transformers on the tiny Qwen3-Next fixture: greedy generate and
    prompt-lookup assisted generation against mtpspec greedy and n-gram speculation.

``--json_out`` has top-level ``speedup`` (best configuration), ``tau``, ``verify_over_step``,
``efficiency`` (of that configuration), ``recompiles``, ``valid``, ``invalid``, ``other_cpu``,
plus ``best``, ``sweep``, ``pieces``, ``alpha``, ``memory``, ``linears``, ``copies`` and ``peer``.
"""

from __future__ import annotations

import pathlib
import statistics
import time

import jax
import numpy as np
from absl import app, flags, logging

import mtpspec
from experiments import cli
from mtpspec import analysis, checkpoints, decoding
from mtpspec.models.inference import resolve_linear

FLAGS = flags.FLAGS
cli.define_checkpoint("Target model directory.")
cli.define_draft_checkpoint()
cli.define_speculation(proposer="", num_draft="")
cli.define_json_out()
flags.DEFINE_bool("quick", False, "Short run: k in 1..3, 2 repeats, 96 new tokens.")
flags.DEFINE_integer("max_new_tokens", None, "New tokens per prompt (default 128; --quick 96).")
flags.DEFINE_integer("repeats", None, "Timed round-robin repeats (default 4; --quick 2).")
flags.DEFINE_integer("piece_iters", None, "Loop iterations per cost piece (default 128; quick 48).")
flags.DEFINE_integer("num_prompts", 4, "Held-out demo prompts to use (1..4).")
flags.DEFINE_integer("max_window", 8, "Report verify window ÷ step for t = 2..max_window.")
cli.define_linear()
flags.DEFINE_string("plot_dir", None, "Write PNG plots here (speedup and τ vs k, theory curve).")
flags.DEFINE_enum("peer_hf", "auto", ["auto", "on", "off"], "HF transformers peer comparison.")
cli.define_tree(
    ["2x1x1", "2x2x1", "3x2x1", "2x2x2", "2x2x1x1"],
    "Draft trees (b1xb2x...) swept beside the chains with proposer mtp (empty: none).",
)
cli.define_adaptive()
flags.DEFINE_string(
    "peer_checkpoint",
    str(cli.ROOT / "tests" / "fixtures" / "hf" / "qwen3_next"),
    "HF model for peer.",
)


def _setting(value, default, quick):
    if value is not None:
        return value
    return quick if FLAGS.quick else default


def peer_comparison(mode: str, k: int, max_new: int, repeats: int) -> dict | None:
    """HF transformers vs mtpspec on the same tiny Qwen3-Next checkpoint, tokens/s in this run."""
    try:
        import torch
        import transformers
    except ImportError:
        if mode == "on":
            raise
        logging.info("peer comparison skipped: torch/transformers not installed (hf extra)")
        return None
    path = FLAGS.peer_checkpoint
    config, params = checkpoints.load(path)
    torch.manual_seed(0)
    model = transformers.AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32).eval()
    rng = np.random.default_rng(1)
    half = rng.integers(0, config.vocab_size, size=20).tolist()
    prompt = half + half + half[:10]  # repeated: prompt lookup has something to find
    ids = torch.tensor([prompt])

    def hf_run(**kw):
        with torch.no_grad():
            t0 = time.perf_counter()
            out = model.generate(
                ids, max_new_tokens=max_new, min_new_tokens=max_new, do_sample=False, **kw
            )
            return out[0, len(prompt) :].tolist(), time.perf_counter() - t0

    rows: dict[str, dict] = {}
    plain_hf, _ = hf_run()
    lookup_error = None
    try:
        lookup_hf, _ = hf_run(prompt_lookup_num_tokens=k)
    except Exception as e:  # noqa: BLE001 - the peer may not support hybrid-cache rollback
        lookup_hf, lookup_error = None, f"{type(e).__name__}: {e}"
        logging.warning("HF prompt-lookup generation failed: %s", lookup_error)
    ngram = mtpspec.SpecConfig(proposer="ngram", num_draft=k)
    ours = {
        "mtpspec greedy": None,
        f"mtpspec ngram k={k}": ngram,
    }
    for spec in ours.values():  # compile
        mtpspec.generate(config, params, [prompt], max_new_tokens=max_new, speculative=spec)
    times: dict[str, list[float]] = {}
    for _ in range(repeats):
        _, t = hf_run()
        times.setdefault("hf greedy", []).append(max_new / t)
        if lookup_hf is not None:
            _, t = hf_run(prompt_lookup_num_tokens=k)
            times.setdefault(f"hf prompt-lookup k={k}", []).append(max_new / t)
        for name, spec in ours.items():
            r = mtpspec.generate(config, params, [prompt], max_new_tokens=max_new, speculative=spec)
            times.setdefault(name, []).append(len(r.tokens[0]) / r.stats["run_s"])
            rows.setdefault(name, {})["tokens"] = r.tokens[0]
    base = statistics.median(times["hf greedy"])
    for name, tps in times.items():
        row = rows.setdefault(name, {})
        row["tokens_per_s"] = statistics.median(tps)
        row["vs_hf_greedy"] = row["tokens_per_s"] / base
    ours_greedy = rows["mtpspec greedy"].pop("tokens")
    rows[f"mtpspec ngram k={k}"].pop("tokens")
    return {
        "checkpoint": path,
        "transformers": transformers.__version__,
        "torch": torch.__version__,
        "max_new_tokens": max_new,
        "timing": "HF: wall time of model.generate (eager torch, includes its Python loop); "
        "mtpspec: device time of the jitted program (compile excluded)",
        "hf_greedy_equals_mtpspec_greedy": plain_hf == ours_greedy,
        "hf_lookup_equals_hf_greedy": None if lookup_hf is None else lookup_hf == plain_hf,
        "hf_lookup_error": lookup_error,
        "rows": rows,
    }


def settings():
    """(proposers, ks, commits, max_new, repeats, piece_iters, config, params, draft)."""
    config, params = checkpoints.load(FLAGS.checkpoint)
    draft = checkpoints.load(FLAGS.draft_checkpoint) if FLAGS.draft_checkpoint else None
    has_mtp = bool(config.mtp_num_layers) and "mtp" in params
    proposers = cli.proposers() if FLAGS.proposer else (["mtp"] if has_mtp else []) + ["ngram"]
    if "draft" in proposers and draft is None:
        raise app.UsageError("proposer 'draft' needs --draft_checkpoint")
    if draft is not None and "draft" not in proposers:
        proposers = [*proposers, "draft"]
    ks = cli.num_drafts() if FLAGS.num_draft else ([1, 2, 3] if FLAGS.quick else [1, 2, 3, 4])
    run = dict(
        max_new=_setting(FLAGS.max_new_tokens, 128, 96),
        repeats=_setting(FLAGS.repeats, 4, 2),
        piece_iters=_setting(FLAGS.piece_iters, 128, 48),
    )
    return config, params, draft, proposers, ks, cli.commits(), run


def measure(config, params, draft, prompts, proposers, ks, commits, run):
    """(pieces per k, the timed sweep): everything that takes device time."""
    # Spin the CPU for ~2 s first: on these shared machines the same program ran up to 2x slower
    # during its first second (frequency / neighbour effects), which would bias the first pieces.
    t_end = time.perf_counter() + 2.0
    while time.perf_counter() < t_end:
        analysis.run_point(config, params, prompts[:1], None, 16)
    longest = max(len(p) for p in prompts)
    capacity = {k: decoding.default_capacity(longest, run["max_new"], k) for k in ks}
    pieces = {
        k: analysis.piece_costs(
            config, params, prompts[0], k, proposers=proposers, commits=commits, draft=draft,
            iters=run["piece_iters"], capacity=capacity[k], linear=FLAGS.linear,
        )
        for k in ks
    }  # fmt: skip
    linear = FLAGS.linear
    points = [analysis.Point("none", 0, None, linear)] + [
        analysis.Point(p, k, c, linear) for p in proposers for k in ks for c in commits
    ]
    points += [analysis.Point("mtp", len(t), commits[0], linear, t) for t in trees(proposers)]
    points += analysis.adaptive_points(proposers, ks, commits[0], linear, FLAGS.p_min,
                                       FLAGS.adaptive)  # fmt: skip
    if resolve_linear(linear) != "xla":
        points.insert(1, analysis.PLAIN_XLA)
    t0 = time.perf_counter()
    timed = analysis.sweep(
        config, params, prompts, points, max_new=run["max_new"], repeats=run["repeats"],
        draft=draft,
    )  # fmt: skip
    logging.info("sweep of %d configurations: %.1f s", len(points), time.perf_counter() - t0)
    return pieces, timed


def trees(proposers) -> list[tuple[int, ...]]:
    """--tree as branching tuples (MTP only: the proposer that drafts trees)."""
    return cli.trees() if "mtp" in proposers else []


def _impls() -> list[str]:
    """The linear implementations to compare: "xla", then the "auto" choice when it differs."""
    return sorted({"xla", resolve_linear("auto")}, key=lambda x: x != "xla")


def print_pieces(pieces, ks, commits, proposers, iters, config):
    t_step = statistics.median(pieces[k]["step"] for k in ks)
    print(f"\ncost pieces (ms per call, jitted loop of {iters}); step {t_step * 1e3:.3f}")
    heads = [f"{'c_' + s:>9}" for s in commits] + [f"{'d_' + p:>8}" for p in proposers]
    print(f"{'k':>2} {'verify':>8} {'v/step':>7} " + " ".join(heads))
    for k in ks:
        pc = pieces[k]
        cs = " ".join(f"{pc[f'commit_{s}'] * 1e3:>9.3f}" for s in commits)
        ds = " ".join(f"{pc.get(f'draft_{p}', float('nan')) * 1e3:>8.3f}" for p in proposers)
        print(f"{k:>2} {pc['verify'] * 1e3:>8.3f} {pc['verify'] / pc['step']:>7.2f} {cs} {ds}")
    rows = list(range(1, max(ks) + 2))
    d_ff = config.intermediate_size or 4 * config.hidden_size
    mm = {
        impl: analysis.matmul_row_scaling(config.hidden_size, d_ff, rows, linear=impl)
        for impl in _impls()
    }
    for impl, costs in mm.items():
        print(
            f"physics ({impl}): [t, {config.hidden_size}] MLP-shaped matmul pair, "
            f"{costs[1] * 1e6:.1f} µs at t=1, cost relative to t=1: "
            + ", ".join(f"t={t} {costs[t] / costs[1]:.2f}x" for t in rows)
        )
    return t_step, mm


def print_rows(rows, timed, repeats):
    plain = timed.points[0]
    plain_tps, plain_decode = analysis.throughput(timed, plain)
    prefill_ms = timed.prefill[plain.program] * 1e3
    print(
        f"\nplain greedy: {plain_decode:.1f} tok/s decode, {plain_tps:.1f} tok/s end to end "
        f"(prefill {prefill_ms:.1f} ms over the prompts; median of {repeats})"
    )
    print(
        "speedup: end-to-end tok/s ÷ plain's; decode: the same with each program's prefill "
        "part removed;\nefficiency = decode speedup ÷ ideal (the ideal has no prefill in it)"
    )
    print(
        f"{'proposer':<8} {'k':>2} {'commit':<7} {'adapts':<16} {'tok/s':>8} {'speedup':>8} "
        f"{'IQR':>11} {'decode':>6} {'tau':>5} {'drafts':>6} {'ideal':>6} {'effic':>6} "
        f"{'v/step':>6} {'c/v':>5}  same  per-position acceptance"
    )
    for r in rows:
        acc = " ".join(f"{x:.2f}" for x in r["position_acceptance"])
        print(
            f"{r['proposer']:<8} {r['num_draft']:>2} {r['commit']:<7} {r['variant'] or '-':<16} "
            f"{r['tokens_per_s']:>8.1f} {r['speedup']:>8.2f} "
            f"{r['speedup_iqr'][0]:>5.2f}-{r['speedup_iqr'][1]:<5.2f} {r['decode_speedup']:>6.2f} "
            f"{r['tau']:>5.2f} {r['mean_drafted']:>6.2f} {r['ideal']:>6.2f} "
            f"{r['efficiency']:>6.2f} "
            f"{r['verify_over_step']:>6.2f} {r['commit_over_verify']:>5.2f}  "
            f"{str(r['same_as_greedy']):<5} {acc}"
        )
    return plain_tps, plain_decode


def linear_report(config, params, prompt, ks, run) -> dict:
    """r(t) and the per-piece decomposition for "xla" and the "auto" choice, in one round-robin."""
    impls = _impls()
    max_t = max(FLAGS.max_window, max(ks) + 1)
    capacity = decoding.default_capacity(len(prompt), run["max_new"], max_t - 1)
    spec = decoding.SpecConfig("ngram", 1)
    prepared = {
        i: decoding.prepare(config, params, [list(prompt)], max_new_tokens=16, speculative=spec,
                            capacity=capacity, linear=i, attention=analysis.stock_attention(i))
        for i in impls
    }  # fmt: skip
    split_ts = sorted({1, *(k + 1 for k in ks)})
    iters, repeats = run["piece_iters"], 7
    pieces = analysis.layer_costs(prepared, split_ts, iters=iters, repeats=repeats)
    windows = analysis.layer_costs(
        prepared, range(1, max_t + 1), pieces=False, iters=iters, repeats=repeats
    )
    ratio = {
        i: {t: windows[i][t]["model"] / windows[i][1]["model"] for t in windows[i]} for i in impls
    }
    print(f"\nverify window ÷ step, r(t) (whole target window, capacity {capacity}; µs per step):")
    print(
        f"{'linear':<6} {'step':>7} " + " ".join(f"{'t=' + str(t):>6}" for t in range(2, max_t + 1))
    )
    for i in impls:
        print(
            f"{i:<6} {windows[i][1]['model'] * 1e6:>7.1f} "
            + " ".join(f"{ratio[i][t]:>6.2f}" for t in range(2, max_t + 1))
        )
    names = (*analysis.PIECES, "rest", "model")
    head = " | ".join(" ".join(f"{i + ' t=' + str(t):>10}" for t in split_ts) for i in impls)
    print(f"\nper piece (µs per call, summed over layers):\n{'piece':<10} {head}")
    for n in names:
        cells = " | ".join(
            " ".join(f"{pieces[i][t][n] * 1e6:>10.1f}" for t in split_ts) for i in impls
        )
        print(f"{n:<10} {cells}")
    return {
        "impls": impls,
        "capacity": capacity,
        "window_over_step": {i: {str(t): r for t, r in ratio[i].items()} for i in impls},
        "window_s": {i: {str(t): w["model"] for t, w in windows[i].items()} for i in impls},
        "decomposition_s": {i: {str(t): row for t, row in pieces[i].items()} for i in impls},
    }


def print_plain_linears(timed) -> dict | None:
    """Plain greedy with the swept linear against plain greedy with XLA's dots, same sweep."""
    xla = analysis.PLAIN_XLA
    if xla not in timed.points:
        return None
    ours = timed.points[0]
    tps, decode = analysis.throughput(timed, ours)
    tps_x, decode_x = analysis.throughput(timed, xla)
    same = timed.tokens[ours] == timed.tokens[xla]
    chosen = resolve_linear(ours.linear)
    print(
        f"plain greedy, linear {chosen!r} vs 'xla' (XLA's own path, attention too): {decode:.1f} "
        f"vs {decode_x:.1f} tok/s decode "
        f"({decode / decode_x:.2f}x), end to end {tps / tps_x:.2f}x; same tokens: {same}"
    )
    return {
        "linear": chosen,
        "decode_speedup_over_xla": decode / decode_x,
        "speedup_over_xla": tps / tps_x,
        "xla_decode_tokens_per_s": decode_x,
        "same_tokens": same,
    }


def copies_report(config, params, prompt, ks, proposers, run) -> dict:
    """Buffer copies in each decoding program's loop body (``analysis.loop_copies``): what XLA
    could not update in place, paid every step."""
    out = {}
    specs = {"plain": None}
    specs.update({f"{p} k={ks[-1]}": decoding.SpecConfig(p, ks[-1]) for p in proposers})
    for name, spec in specs.items():
        if spec is not None and spec.proposer == "draft":
            continue  # its program needs the draft model's arguments; the target's loop is shown
        prep = decoding.prepare(
            config, params, [list(prompt)], max_new_tokens=run["max_new"], speculative=spec,
            linear=FLAGS.linear,
        )  # fmt: skip
        copies = analysis.loop_copies(prep)
        out[name] = {"copies": len(copies), "bytes": sum(b for _, b in copies)}
    print(
        "loop-body buffer copies per step: "
        + ", ".join(f"{n} {v['copies']} ({v['bytes'] / 1024:.1f} KiB)" for n, v in out.items())
    )
    return out


def print_peer(peer):
    print(f"\npeer ({peer['checkpoint']}, transformers {peer['transformers']}):")
    for name, r in peer["rows"].items():
        print(f"  {name:<24} {r['tokens_per_s']:>9.1f} tok/s  {r['vs_hf_greedy']:>6.2f}x")
    failed = f"; HF lookup failed: {peer['hf_lookup_error']}" if peer["hf_lookup_error"] else ""
    print(
        f"  HF greedy == mtpspec greedy: {peer['hf_greedy_equals_mtpspec_greedy']}; "
        f"HF lookup == HF greedy: {peer['hf_lookup_equals_hf_greedy']}{failed}"
    )


def print_verdict(rows, best, plain_decode, t_step, recompiles, other_cpu) -> list[str]:
    """The best configuration, or why this run is invalid (``analysis.self_checks``)."""
    invalid = analysis.self_checks(rows, plain_decode, t_step)
    if recompiles:
        invalid.append(f"{recompiles} recompiles during the timed part")
    print(f"\nother processes and steal during the measurement: {other_cpu:.0%} of the CPU")
    summary = (
        f"{best['proposer']} k={best['num_draft']} {best['commit']} {best['variant']}: speedup "
        f"{best['speedup']:.2f} (IQR {best['speedup_iqr'][0]:.2f}-{best['speedup_iqr'][1]:.2f}), "
        f"tau {best['tau']:.2f}, verify_over_step {best['verify_over_step']:.2f}, efficiency "
        f"{best['efficiency']:.2f}; recompiles during the timed part: {recompiles}"
    )
    if invalid:
        print("INVALID RUN (self-checks failed; the figures above are not a result):")
        print("".join(f"  - {why}\n" for why in invalid), end="")
        print(f"fastest configuration, not a result: {summary}")
    else:
        print(f"best: {summary}")
    return invalid


def main(argv):
    del argv
    config, params, draft, proposers, ks, commits, run = settings()
    prompts = cli.bench_prompts(config, FLAGS.num_prompts)
    print(
        f"{FLAGS.checkpoint}: {config.family}, H={config.hidden_size}, {config.num_layers} layers, "
        f"vocab {config.vocab_size}; jax {jax.__version__} on {jax.default_backend()}; "
        f"{len(prompts)} prompts × {run['max_new']} tokens, batch 1, {run['repeats']} "
        "round-robin repeats"
    )
    with analysis.MachineLoad() as load:
        pieces, timed = measure(config, params, draft, prompts, proposers, ks, commits, run)
    shapes = trees(proposers)
    costs = analysis.tree_costs(config, params, prompts[0], shapes) if shapes else None
    rows = analysis.summarize(timed, pieces, costs and costs["tree"])
    chains = [r for r in rows if r["tree"] is None]
    alpha = analysis.alpha_per_proposer([r for r in chains if not r["variant"]])
    best = analysis.best(rows)
    t_step, mm = print_pieces(pieces, ks, commits, proposers, run["piece_iters"], config)
    plain_tps, plain_decode = print_rows(chains, timed, run["repeats"])
    print("alpha (i.i.d. fit to per-position acceptance): "
          + ", ".join(f"{p} {a:.3f}" for p, a in alpha.items()))  # fmt: skip
    mtp = [r for r in rows if r["proposer"] == "mtp" and not r["variant"]]
    if shapes:
        print("\nchains and trees (mtp; w/step: the verify window ÷ a step, in-loop):")
        print(analysis.tree_table(mtp, costs))
    memory = analysis.memory_report(pieces, ks[-1], commits)
    plain_linears = print_plain_linears(timed)
    linears = linear_report(config, params, prompts[0], ks, run)
    copies = copies_report(config, params, prompts[0], ks, proposers, run)
    invalid = print_verdict(rows, best, plain_decode, t_step, timed.recompiles, load.other)
    if not all(r["same_as_greedy"] for r in rows):
        raise RuntimeError("a speculative configuration emitted tokens that differ from greedy")
    peer = None
    if FLAGS.peer_hf != "off":
        peer = peer_comparison(FLAGS.peer_hf, max(ks[0], 2), min(run["max_new"], 64),
                               max(run["repeats"], 2))  # fmt: skip
        if peer:
            print_peer(peer)
    if FLAGS.plot_dir:
        out = pathlib.Path(FLAGS.plot_dir)
        out.mkdir(parents=True, exist_ok=True)
        title = (
            f"{pathlib.Path(FLAGS.checkpoint).name}: {len(prompts)} prompts × {run['max_new']} "
            f"tokens, jax {jax.__version__} {jax.default_backend()}"
        )
        analysis.plot_sweep(
            [r for r in chains if not r["variant"]],
            alpha,
            str(out / "speedup_tau_vs_k.png"),
            title=title,
        )
        print(f"plots: {out / 'speedup_tau_vs_k.png'}")
        if shapes:
            analysis.plot_nodes(mtp, str(out / "tau_speedup_vs_nodes.png"), title=title)
            print(f"plots: {out / 'tau_speedup_vs_nodes.png'}")
    cli.write_json({
        "speedup": best["speedup"], "tau": best["tau"],
        "verify_over_step": best["verify_over_step"], "efficiency": best["efficiency"],
        "recompiles": timed.recompiles, "valid": not invalid, "invalid": invalid,
        "other_cpu": load.other, "best": best, "plain_tokens_per_s": plain_tps,
        "plain_decode_tokens_per_s": plain_decode, "definitions": DEFINITIONS, "t_step_s": t_step,
        "sweep": rows, "pieces": {str(k): v for k, v in pieces.items()}, "alpha": alpha,
        "memory": memory, "plain_linears": plain_linears, "linears": linears, "copies": copies,
        "matmul_row_scaling": {i: {str(t): v for t, v in c.items()} for i, c in mm.items()},
        "peer": peer, "tree_costs": costs and {
            "step_s": costs["step_s"], "chain": {str(t): r for t, r in costs["chain"].items()},
            "tree": {"x".join(map(str, t)): r for t, r in costs["tree"].items()}},
        "settings": dict(
            checkpoint=FLAGS.checkpoint, ks=ks, commits=commits, proposers=proposers,
            max_new_tokens=run["max_new"], repeats=run["repeats"], prompts=len(prompts),
            jax=jax.__version__, backend=jax.default_backend(), linear=FLAGS.linear,
        ),
    })  # fmt: skip


DEFINITIONS = (
    "speedup: end-to-end tokens/s (device time of generate, prefill included, compile excluded) "
    "over plain greedy's; decode_speedup: the same with each program's prefill part (the "
    "program at max_new_tokens=1) subtracted; efficiency = decode_speedup / ideal, ideal = "
    "tau * t_step / (t_verify + t_draft)"
)


if __name__ == "__main__":
    cli.run(main)
