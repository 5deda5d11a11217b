"""Speculative decoding sweep: every proposer × commit strategy × k against plain greedy, one run.

    python -m experiments.bench_speculative --quick --json_out=/tmp/bench.json --plot_dir=/tmp/plots
    python -m experiments.bench_speculative --checkpoint=DIR --ks=1,2,3,4,6 --proposers=mtp,ngram
    python -m experiments.bench_speculative --peer_hf=on     # with the `hf` extra installed

On the default model (or any checkpoint), in this one process:
  * plain greedy and each configuration, timed round-robin (every repeat runs every configuration
    once, so a noisy neighbour hurts all of them alike); tokens/s = tokens ÷ device seconds over
    the held-out demo prompts at batch 1, compile excluded; speedup = ratio to plain greedy;
  * τ (tokens per verify step), per-position acceptance, whether the tokens equal plain greedy;
  * the jitted cost pieces (``mtpspec.analysis.piece_costs``): verify window over one step, commit
    over verify, draft cost; the ideal speedup τ·t_step/(t_verify+t_draft) and efficiency =
    measured ÷ ideal (DESIGN.md, "Performance physics");
  * ``recompiles``: XLA compilations during the timed part (must be 0);
  * decode-state bytes and the commit data / XLA temp bytes of verify+commit per strategy;
  * α fitted per proposer to the per-position acceptance, and the theory curve (1−α^{k+1})/(1−α);
  * optionally (``--peer_hf``) HF transformers on the tiny Qwen3-Next fixture: greedy generate and
    prompt-lookup assisted generation against mtpspec greedy and n-gram speculation.

``--json_out`` has top-level ``speedup`` (best configuration), ``tau``, ``verify_over_step``,
``efficiency`` (of that configuration), ``recompiles``, plus ``best``, ``sweep``, ``pieces``,
``alpha``, ``memory`` and ``peer``.
"""

from __future__ import annotations

import json
import pathlib
import statistics
import time

import jax
import numpy as np
from absl import app, flags, logging

import mtpspec
from mtpspec import analysis, checkpoints
from mtpspec.decoding.loop import BUCKET
from mtpspec.training.data import ByteTokenizer

ROOT = pathlib.Path(__file__).resolve().parent.parent
ASSETS = ROOT / "mtpspec" / "assets"
FLAGS = flags.FLAGS
flags.DEFINE_string("checkpoint", str(ASSETS / "default_model"), "Target model directory.")
flags.DEFINE_string("draft_checkpoint", None, "A draft model (same vocabulary) for proposer=draft.")
flags.DEFINE_bool("quick", False, "Short run: k in 1..3, 2 repeats, 96 new tokens.")
flags.DEFINE_list("proposers", None, "Proposers (default: mtp if the model has a head, ngram).")
flags.DEFINE_list("commits", ["scan", "states", "replay"], "Commit strategies.")
flags.DEFINE_list("ks", None, "Draft lengths k (default 1,2,3,4; --quick 1,2,3).")
flags.DEFINE_integer("max_new_tokens", None, "New tokens per prompt (default 128; --quick 96).")
flags.DEFINE_integer("repeats", None, "Timed round-robin repeats (default 4; --quick 2).")
flags.DEFINE_integer("piece_iters", None, "Loop iterations per cost piece (default 128; quick 48).")
flags.DEFINE_integer("num_prompts", 4, "Held-out demo prompts to use (1..4).")
flags.DEFINE_string("json_out", None, "Write the results as JSON here.")
flags.DEFINE_string("plot_dir", None, "Write PNG plots here (speedup and τ vs k, theory curve).")
flags.DEFINE_enum("peer_hf", "auto", ["auto", "on", "off"], "HF transformers peer comparison.")
flags.DEFINE_string(
    "peer_checkpoint", str(ROOT / "tests" / "fixtures" / "hf" / "qwen3_next"), "HF model for peer."
)


def _setting(value, default, quick):
    if value is not None:
        return value
    return quick if FLAGS.quick else default


def load_prompts(config, n: int) -> list[list[int]]:
    """The held-out demo prompts (byte vocabulary), else deterministic repeated random ids."""
    if not 1 <= n <= 4:
        raise ValueError(f"--num_prompts must be in 1..4, got {n}")
    if config.vocab_size == 256:
        spec = json.loads((ASSETS / "demo_prompts.json").read_text())
        return [ByteTokenizer().encode(p["text"]) for p in spec["prompts"][:n]]
    rng = np.random.default_rng(0)
    half = rng.integers(0, config.vocab_size, size=(n, 40))
    return np.concatenate([half, half], axis=1).tolist()


def run_config(config, params, prompts, spec, max_new):
    """One pass over the prompts at batch 1: (tokens per prompt, device seconds, stats list)."""
    results = [
        mtpspec.generate(config, params, [p], max_new_tokens=max_new, speculative=spec)
        for p in prompts
    ]
    seconds = sum(r.stats["run_s"] for r in results)
    return [r.tokens[0] for r in results], seconds, [r.stats for r in results]


def pooled_acceptance(stats: list[dict], k: int) -> tuple[float, list[float]]:
    """τ and per-position acceptance pooled over prompts (weighted by verify steps)."""
    steps = sum(s["steps"][0] for s in stats)
    accepted = np.array([a for s in stats for a in s["accepted"][0] if a >= 0])
    tau = float((accepted + 1).sum() / max(steps, 1))
    pos = [float((accepted >= i).mean()) if len(accepted) else 0.0 for i in range(1, k + 1)]
    return tau, pos


def sweep(config, params, prompts, proposers, commits, ks, max_new, repeats, draft):
    configs = [("none", 0, None)]
    configs += [(p, k, c) for p in proposers for k in ks for c in commits]

    def spec_of(proposer, k, commit):
        if proposer == "none":
            return None
        extra = {}
        if proposer == "draft":
            extra = dict(draft_config=draft[0], draft_params=draft[1])
        return mtpspec.SpecConfig(proposer=proposer, num_draft=k, commit=commit, **extra)

    compile_s, outputs = {}, {}
    t0 = time.perf_counter()
    for cfg in configs:  # warm-up: compiles (and checks) every configuration
        tokens, _, stats = run_config(config, params, prompts, spec_of(*cfg), max_new)
        outputs[cfg] = (tokens, stats)
        compile_s[cfg] = sum(s.get("compile_s", 0.0) for s in stats)
    logging.info("compiled %d configurations in %.1f s", len(configs), time.perf_counter() - t0)
    # The prefill part (prompt forward, first token, MTP catch-up and first drafts) does not
    # depend on the commit strategy: per (proposer, k) the same program with max_new_tokens=1
    # (its loop runs no step) is timed in the same round-robin; decode time = run − prefill.
    prefill_cfgs = {}
    for cfg in configs:
        prefill_cfgs.setdefault(cfg[:2], cfg)
    for cfg in prefill_cfgs.values():
        run_config(config, params, prompts, spec_of(*cfg), 1)  # compile
    timings = {cfg: [] for cfg in configs}  # per repeat: device seconds over the prompts
    prefill_times = {key: [] for key in prefill_cfgs}
    with analysis.CompileCounter() as counter:
        for _ in range(repeats):
            for cfg in configs:
                tokens, seconds, _ = run_config(config, params, prompts, spec_of(*cfg), max_new)
                if tokens != outputs[cfg][0]:
                    raise RuntimeError(f"{cfg}: tokens changed between runs (nondeterminism)")
                timings[cfg].append(seconds)
            for key, cfg in prefill_cfgs.items():
                prefill_times[key].append(run_config(config, params, prompts, spec_of(*cfg), 1)[1])
    prefill = {key: statistics.median(v) for key, v in prefill_times.items()}
    return configs, outputs, timings, compile_s, prefill, counter.count


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
    ngram = mtpspec.SpecConfig(proposer="ngram", num_draft=k, commit="states")
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


def main(argv):
    del argv
    ks = [int(k) for k in _setting(FLAGS.ks, ["1", "2", "3", "4"], ["1", "2", "3"])]
    max_new = _setting(FLAGS.max_new_tokens, 128, 96)
    repeats = _setting(FLAGS.repeats, 4, 2)
    piece_iters = _setting(FLAGS.piece_iters, 128, 48)
    config, params = checkpoints.load(FLAGS.checkpoint)
    draft = checkpoints.load(FLAGS.draft_checkpoint) if FLAGS.draft_checkpoint else None
    has_mtp = bool(config.mtp_num_layers) and "mtp" in params
    proposers = FLAGS.proposers or (["mtp"] if has_mtp else []) + ["ngram"]
    if "draft" in proposers and draft is None:
        raise app.UsageError("proposer 'draft' needs --draft_checkpoint")
    if draft is not None and "draft" not in proposers:
        proposers = [*proposers, "draft"]
    prompts = load_prompts(config, FLAGS.num_prompts)
    print(
        f"{FLAGS.checkpoint}: {config.family}, H={config.hidden_size}, {config.num_layers} layers, "
        f"vocab {config.vocab_size}; jax {jax.__version__} on {jax.default_backend()}; "
        f"{len(prompts)} prompts × {max_new} tokens, batch 1, {repeats} round-robin repeats"
    )

    # Spin the CPU for ~2 s first: on these shared machines the same program ran up to 2x slower
    # during its first second (frequency / neighbour effects), which would bias the first pieces.
    t_end = time.perf_counter() + 2.0
    while time.perf_counter() < t_end:
        run_config(config, params, prompts[:1], None, 16)
    pieces = {}
    longest = max(len(p) for p in prompts)
    for k in ks:
        # the same KV capacity as generate's (every step attends over all slots, masked)
        capacity = -(-longest // BUCKET) * BUCKET + -(-max_new // BUCKET) * BUCKET + k + 1
        pieces[k] = analysis.piece_costs(
            config, params, prompts[0], k, proposers=proposers, commits=FLAGS.commits,
            draft=draft, iters=piece_iters, capacity=capacity,
        )  # fmt: skip
    configs, outputs, timings, compile_s, prefill, recompiles = sweep(
        config, params, prompts, proposers, FLAGS.commits, ks, max_new, repeats, draft
    )
    plain_cfg = ("none", 0, None)

    def medians(cfg):
        """(end-to-end tok/s, decode tok/s); decode is NaN when prefill is ≥ 80 % of the run
        (too little generation to tell the loop's time apart from noise)."""
        seconds = statistics.median(timings[cfg])
        total = sum(len(t) for t in outputs[cfg][0])
        decode_s = seconds - prefill[cfg[:2]]
        ok = decode_s > 0.2 * seconds
        return total / seconds, (total - len(prompts)) / decode_s if ok else float("nan")

    plain_tps, plain_decode_tps = medians(plain_cfg)
    plain_tokens = outputs[plain_cfg][0]
    t_step = statistics.median(pieces[k]["step"] for k in ks)

    rows = []
    for cfg in configs[1:]:
        proposer, k, commit = cfg
        pc = pieces[k]
        tokens, stats = outputs[cfg]
        tau, pos = pooled_acceptance(stats, k)
        tps, decode_tps = medians(cfg)
        t_draft = pc.get(f"draft_{proposer}", 0.0)
        ideal = analysis.ideal_speedup(tau, pc["step"], pc["verify"], t_draft)
        speedup = tps / plain_tps
        decode_speedup = decode_tps / plain_decode_tps
        rows.append(
            dict(
                proposer=proposer,
                num_draft=k,
                commit=commit,
                tokens_per_s=tps,
                decode_tokens_per_s=decode_tps,
                speedup=speedup,
                decode_speedup=decode_speedup,
                prefill_s=prefill[cfg[:2]],
                tau=tau,
                position_acceptance=pos,
                verify_over_step=pc["verify"] / pc["step"],
                draft_over_step=t_draft / pc["step"],
                commit_over_verify=pc[f"commit_{commit}"] / pc["verify"],
                ideal=ideal,
                efficiency=decode_speedup / ideal,
                same_as_greedy=tokens == plain_tokens,
                compile_s=compile_s[cfg],
            )
        )
    alpha = {}
    for proposer in proposers:
        runs = [r["position_acceptance"] for r in rows if r["proposer"] == proposer]
        alpha[proposer] = analysis.fit_alpha(runs)
    best = max(rows, key=lambda r: r["speedup"])
    memory = {
        "state_bytes": pieces[ks[-1]]["state_bytes"],
        "k": ks[-1],
        **{
            s: {
                "commit_data_bytes": pieces[ks[-1]][f"commit_data_bytes_{s}"],
                "verify_commit_temp_bytes": pieces[ks[-1]][f"step_temp_bytes_{s}"],
            }
            for s in FLAGS.commits
        },
    }

    print(f"\ncost pieces (ms per call, jitted loop of {piece_iters}); step {t_step * 1e3:.3f}")
    heads = [f"{'c_' + s:>9}" for s in FLAGS.commits] + [f"{'d_' + p:>8}" for p in proposers]
    print(f"{'k':>2} {'verify':>8} {'v/step':>7} " + " ".join(heads))
    for k in ks:
        pc = pieces[k]
        commits = " ".join(f"{pc[f'commit_{s}'] * 1e3:>9.3f}" for s in FLAGS.commits)
        drafts = " ".join(f"{pc.get(f'draft_{p}', float('nan')) * 1e3:>8.3f}" for p in proposers)
        ratio = pc["verify"] / pc["step"]
        print(f"{k:>2} {pc['verify'] * 1e3:>8.3f} {ratio:>7.2f} {commits} {drafts}")
    mm_rows = list(range(1, max(ks) + 2))
    mm = analysis.matmul_row_scaling(
        config.hidden_size, config.intermediate_size or 4 * config.hidden_size, mm_rows
    )
    print(
        f"physics: [t, {config.hidden_size}] MLP-shaped matmul pair, cost relative to t=1: "
        + ", ".join(f"t={t} {mm[t] / mm[1]:.2f}x" for t in mm_rows)
    )
    print(
        f"\nplain greedy: {plain_decode_tps:.1f} tok/s decode, {plain_tps:.1f} tok/s end to end "
        f"(prefill {prefill[plain_cfg[:2]] * 1e3:.1f} ms over the prompts; median of {repeats})"
    )
    print(
        "speedup: end-to-end tok/s ÷ plain's; decode: the same with each program's prefill "
        "part removed;\nefficiency = decode speedup ÷ ideal (the ideal has no prefill in it)"
    )
    print(
        f"{'proposer':<8} {'k':>2} {'commit':<7} {'tok/s':>8} {'speedup':>8} {'decode':>6} "
        f"{'tau':>5} "
        f"{'ideal':>6} {'effic':>6} {'v/step':>6} {'c/v':>5}  same  per-position acceptance"
    )
    for r in rows:
        acc = " ".join(f"{x:.2f}" for x in r["position_acceptance"])
        print(
            f"{r['proposer']:<8} {r['num_draft']:>2} {r['commit']:<7} "
            f"{r['tokens_per_s']:>8.1f} {r['speedup']:>8.2f} "
            f"{r['decode_speedup']:>6.2f} "
            f"{r['tau']:>5.2f} {r['ideal']:>6.2f} {r['efficiency']:>6.2f} "
            f"{r['verify_over_step']:>6.2f} {r['commit_over_verify']:>5.2f}  "
            f"{str(r['same_as_greedy']):<5} {acc}"
        )
    print("alpha (i.i.d. fit to per-position acceptance): "
          + ", ".join(f"{p} {a:.3f}" for p, a in alpha.items()))  # fmt: skip
    mem = ", ".join(
        f"{s}: commit data {memory[s]['commit_data_bytes'] / 1024:.1f} KiB, temp "
        f"{(memory[s]['verify_commit_temp_bytes'] or 0) / 1024:.1f} KiB"
        for s in FLAGS.commits
    )
    print(f"memory (k={ks[-1]}): decode state {memory['state_bytes'] / 1024:.1f} KiB; {mem}")
    print(
        f"\nbest: {best['proposer']} k={best['num_draft']} {best['commit']}: speedup "
        f"{best['speedup']:.2f}, tau {best['tau']:.2f}, verify_over_step "
        f"{best['verify_over_step']:.2f}, efficiency {best['efficiency']:.2f}; recompiles "
        f"during the timed part: {recompiles}"
    )
    if not all(r["same_as_greedy"] for r in rows):
        raise RuntimeError("a speculative configuration emitted tokens that differ from greedy")

    peer = None
    if FLAGS.peer_hf != "off":
        peer = peer_comparison(FLAGS.peer_hf, max(ks[0], 2), min(max_new, 64), max(repeats, 2))
        if peer:
            print(f"\npeer ({peer['checkpoint']}, transformers {peer['transformers']}):")
            for name, r in peer["rows"].items():
                print(f"  {name:<24} {r['tokens_per_s']:>9.1f} tok/s  {r['vs_hf_greedy']:>6.2f}x")
            print(
                f"  HF greedy == mtpspec greedy: {peer['hf_greedy_equals_mtpspec_greedy']}; "
                f"HF lookup == HF greedy: {peer['hf_lookup_equals_hf_greedy']}"
                + (
                    f"; HF lookup failed: {peer['hf_lookup_error']}"
                    if peer["hf_lookup_error"]
                    else ""
                )
            )

    if FLAGS.plot_dir:
        out = pathlib.Path(FLAGS.plot_dir)
        out.mkdir(parents=True, exist_ok=True)
        title = (
            f"{pathlib.Path(FLAGS.checkpoint).name}: {len(prompts)} prompts × {max_new} tokens, "
            f"jax {jax.__version__} {jax.default_backend()}"
        )
        analysis.plot_sweep(rows, alpha, str(out / "speedup_tau_vs_k.png"), title=title)
        print(f"plots: {out / 'speedup_tau_vs_k.png'}")
    if FLAGS.json_out:
        result = {
            "speedup": best["speedup"],
            "tau": best["tau"],
            "verify_over_step": best["verify_over_step"],
            "efficiency": best["efficiency"],
            "recompiles": recompiles,
            "best": best,
            "plain_tokens_per_s": plain_tps,
            "plain_decode_tokens_per_s": plain_decode_tps,
            "definitions": "speedup: end-to-end tokens/s (device time of generate, prefill "
            "included, compile excluded) over plain greedy's; decode_speedup: the same with each "
            "program's prefill part (the program at max_new_tokens=1) subtracted; efficiency = "
            "decode_speedup / ideal, ideal = tau * t_step / (t_verify + t_draft)",
            "t_step_s": t_step,
            "sweep": rows,
            "pieces": {str(k): v for k, v in pieces.items()},
            "alpha": alpha,
            "memory": memory,
            "matmul_row_scaling": {str(t): v for t, v in mm.items()},
            "peer": peer,
            "settings": dict(
                checkpoint=FLAGS.checkpoint, ks=ks, commits=FLAGS.commits, proposers=proposers,
                max_new_tokens=max_new, repeats=repeats, prompts=len(prompts),
                jax=jax.__version__, backend=jax.default_backend(),
            ),
        }  # fmt: skip
        pathlib.Path(FLAGS.json_out).write_text(json.dumps(result, indent=2))
        print(f"json: {FLAGS.json_out}")


if __name__ == "__main__":
    app.run(main)
