"""Speculative decoding benchmark: plain vs speculative tok/s, τ, and the cost of each piece.

    python -m experiments.bench_spec                                   # qwen3_next fixture
    python -m experiments.bench_spec --bench_checkpoint=tests/fixtures/hf/qwen3_5 --num_draft=3

Everything is measured in this one process (ratios only mean something within a run):
  * generate() tok/s, plain greedy and each proposer × commit strategy, with τ (tokens per verify
    step) and whether the tokens equal plain greedy;
  * jitted pieces on the same state: 1-token step, (k+1)-token verify per GDN method, each commit
    strategy (as a fraction of verify), and the MTP draft (catch-up + chain);
  * ideal speed-up = τ · t_step / (t_verify + t_draft) and efficiency = measured / ideal.
"""

from __future__ import annotations

import json
import statistics
import time

import jax
import jax.numpy as jnp
import numpy as np
from absl import app, flags

import mtpspec
from mtpspec import checkpoints, models
from mtpspec.decoding.commit import commit_window
from mtpspec.decoding.proposers import mtp_catch_up_and_draft

FLAGS = flags.FLAGS
flags.DEFINE_string("bench_checkpoint", "tests/fixtures/hf/qwen3_next", "HF or mtpspec checkpoint.")
flags.DEFINE_integer("num_draft", 2, "k drafts per verify step.")
flags.DEFINE_integer("max_new_tokens", 96, "Tokens to generate per prompt.")
flags.DEFINE_integer("batch", 1, "Prompts in the batch.")
flags.DEFINE_integer("prompt_len", 24, "Prompt length (random tokens, then repeated once).")
flags.DEFINE_integer("repeats", 3, "Timed runs per configuration (median).")
flags.DEFINE_list("proposers", ["mtp", "ngram"], "Proposers to run.")
flags.DEFINE_list("commits", ["scan", "states", "replay"], "Commit strategies to run.")
flags.DEFINE_string("json_out", None, "Write results as JSON here.")


def median_time(fn, *args) -> float:
    jax.block_until_ready(fn(*args))
    times = []
    for _ in range(FLAGS.repeats):
        start = time.perf_counter()
        jax.block_until_ready(fn(*args))
        times.append(time.perf_counter() - start)
    return statistics.median(times)


def time_generate(config, params, prompts, spec):
    kw = dict(max_new_tokens=FLAGS.max_new_tokens, speculative=spec)
    mtpspec.generate(config, params, prompts, **kw)  # compile
    runs = [mtpspec.generate(config, params, prompts, **kw) for _ in range(FLAGS.repeats)]
    best = sorted(runs, key=lambda r: r.stats["run_s"])[len(runs) // 2]
    return best


def piece_timings(config, params, prompts, k):
    """Median seconds of the jitted pieces on one post-prefill state."""
    tokens = jnp.asarray(prompts, jnp.int32)
    out = models.prefill(config, params, tokens, capacity=tokens.shape[1] + 64)
    state = out.state
    window = jnp.tile(tokens[:, -1:], (1, k + 1))
    b = tokens.shape[0]
    res = {}
    step = jax.jit(
        lambda p, s, t: (
            models.decoder.window_step_impl(
                config, p, s, t, jnp.ones((b,), jnp.int32), "auto"
            ).logits
        )
    )  # noqa: E501
    res["step"] = median_time(step, params, state, window[:, :1])
    full = jnp.full((b,), k + 1, jnp.int32)
    for method in ("recurrent", "chunk", "assoc"):
        verify = jax.jit(
            lambda p, s, t, m=method: (
                models.decoder.window_step_impl(config, p, s, t, full, m).logits
            )
        )
        res[f"verify_{method}"] = median_time(verify, params, state, window)
    for strategy in ("scan", "states", "replay"):
        verified = models.decoder._window_step(
            config, params, state, window, full, "auto", strategy == "states"
        )
        n = jnp.full((b,), max(k // 2, 1), jnp.int32)
        commit = jax.jit(lambda s, v, c, n, st=strategy: commit_window(s, v, c, n, st))
        res[f"commit_{strategy}"] = median_time(commit, state, verified.state, verified.commit, n)
    if config.mtp_num_layers and "mtp" in params:
        hid = out.hidden[:, -(k + 1) :]

        def draft(p, s, h, t):
            def greedy(x, i):
                return jnp.argmax(x, -1).astype(jnp.int32), jnp.zeros(x.shape[:-1] + (0,))

            return mtp_catch_up_and_draft(config, p, s, h, t, full, k, greedy)[0]

        res["draft_mtp"] = median_time(jax.jit(draft), params, state, hid, window)
    return res


def main(argv):
    del argv
    config, params = checkpoints.load(FLAGS.bench_checkpoint)
    rng = np.random.default_rng(0)
    base = rng.integers(0, config.vocab_size, size=(FLAGS.batch, FLAGS.prompt_len // 2))
    prompts = np.concatenate([base, base], axis=1).tolist()  # repeated: n-gram has something
    k = FLAGS.num_draft
    print(
        f"{FLAGS.bench_checkpoint}: {config.family}, H={config.hidden_size}, "
        f"{config.num_layers} layers, jax {jax.__version__} on {jax.default_backend()}"
    )

    pieces = piece_timings(config, params, prompts, k)
    verify = pieces["verify_recurrent"], pieces["verify_chunk"], pieces["verify_assoc"]
    print(f"\npieces (ms, median of {FLAGS.repeats}): 1-token step {pieces['step'] * 1e3:.3f}")
    for m, t in zip(("recurrent", "chunk", "assoc"), verify, strict=True):
        print(f"  verify k+1={k + 1} gdn={m:<9} {t * 1e3:8.3f}   ({t / pieces['step']:.2f}x step)")
    t_verify = pieces["verify_chunk"]  # what "auto" runs for k+1 >= 2
    for s in ("scan", "states", "replay"):
        t = pieces[f"commit_{s}"]
        print(f"  commit {s:<7} {t * 1e3:8.3f}   ({t / t_verify:.3f} of verify)")
    if "draft_mtp" in pieces:
        print(f"  mtp draft (catch-up + chain of {k}) {pieces['draft_mtp'] * 1e3:.3f}")

    plain = time_generate(config, params, prompts, None)
    plain_tps = plain.stats["tokens_per_s"]
    print(f"\nplain greedy: {plain_tps:.1f} tok/s")
    print(
        f"{'proposer':<8} {'commit':<7} {'tok/s':>8} {'speedup':>8} {'tau':>6} "
        f"{'ideal':>6} {'effic.':>6}  same"
    )
    rows = []
    for proposer in FLAGS.proposers:
        if proposer == "mtp" and "draft_mtp" not in pieces:
            continue
        t_draft = pieces.get("draft_mtp", 0.0) if proposer == "mtp" else 0.0
        for strategy in FLAGS.commits:
            spec = mtpspec.SpecConfig(proposer=proposer, num_draft=k, commit=strategy)
            r = time_generate(config, params, prompts, spec)
            tps, tau = r.stats["tokens_per_s"], r.stats["tau"]
            ideal = tau * pieces["step"] / (t_verify + t_draft)
            speedup = tps / plain_tps
            same = r.tokens == plain.tokens
            rows.append(
                dict(
                    proposer=proposer,
                    commit=strategy,
                    tokens_per_s=tps,
                    speedup=speedup,
                    tau=tau,
                    ideal=ideal,
                    efficiency=speedup / ideal,
                    same=same,
                )
            )
            print(
                f"{proposer:<8} {strategy:<7} {tps:>8.1f} {speedup:>8.2f} {tau:>6.2f} "
                f"{ideal:>6.2f} {speedup / ideal:>6.2f}  {same}"
            )
    if FLAGS.json_out:
        with open(FLAGS.json_out, "w") as f:
            json.dump(
                {"pieces": pieces, "plain_tokens_per_s": plain_tps, "rows": rows}, f, indent=2
            )


if __name__ == "__main__":
    app.run(main)
