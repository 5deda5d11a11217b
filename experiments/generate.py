"""Generate text with plain or speculative decoding; ``--demo`` compares them on the default model.

    python -m experiments.generate --prompt="def fib(n):" --proposer=mtp --num_draft=3
    python -m experiments.generate --checkpoint=tests/fixtures/hf/qwen3_next --prompt_ids=1,2,3
    python -m experiments.generate --demo                  # what `make demo` runs
    python -m experiments.generate --demo --num_draft=1,2,3
    python -m experiments.generate --demo --mesh=2x4       # sharded (experiments/cli.py)

--checkpoint is an mtpspec checkpoint (``checkpoints.save_params``: config.json + params/) or an HF
directory (config.json + safetensors). Text goes through the byte tokenizer when the vocabulary is
256, else through the checkpoint's tokenizer.json (needs the ``tokenizers`` package).
Speed figures exclude compilation (reported separately) and are measured in this one run.
"""

from __future__ import annotations

import pathlib
import statistics

from absl import app, flags

import mtpspec
from experiments import cli
from mtpspec import checkpoints
from mtpspec.decoding.stats import pooled

FLAGS = flags.FLAGS
cli.define_checkpoint()
cli.define_speculation()
cli.define_linear()
cli.define_json_out()
cli.define_mesh()
flags.DEFINE_float("temperature", 0.0, "0 = greedy.")
flags.DEFINE_integer("top_k", 0, "Top-k filter (0 = off).")
flags.DEFINE_float("top_p", 1.0, "Nucleus filter.")
flags.DEFINE_integer("seed", 0, "Sampling seed.")
flags.DEFINE_string("prompt", None, "Prompt text.")
flags.DEFINE_string("prompt_file", None, "File whose text is the prompt.")
flags.DEFINE_list("prompt_ids", None, "Prompt as token ids (no tokenizer needed).")
flags.DEFINE_integer("max_new_tokens", 128, "Tokens to generate.")
flags.DEFINE_integer("rounds", 5, "--demo: timed rounds per configuration, run round-robin.")
flags.DEFINE_bool(
    "demo", False, "Compare plain greedy, MTP and n-gram (each --num_draft) on held-out prompts."
)


def spec_config(proposer: str, k: int, commit: str):
    return None if proposer == "none" else mtpspec.SpecConfig(proposer, k, commit)


def run(config, params, prompts, proposer, k, commit, **kw):
    """One configuration: compiled (warm-up), then ``timed()`` decodes every prompt at batch 1
    and returns the seconds of that round (device time, compile excluded)."""
    spec = spec_config(proposer, k, commit)
    first = mtpspec.generate(config, params, prompts[:1], speculative=spec, **kw)  # compile
    row = {
        "proposer": proposer,
        "num_draft": k if spec else 0,
        "commit": commit if spec else None,
        "compile_s": first.stats["compile_s"],
        "round_s": [],
    }

    def timed():
        results = [mtpspec.generate(config, params, [p], speculative=spec, **kw) for p in prompts]
        row["tokens"] = [r.tokens[0] for r in results]
        row["tau"] = pooled(r.stats for r in results)["tau"] if spec else 1.0
        row["round_s"].append(sum(r.stats["run_s"] for r in results))

    return row, timed


def round_robin(runs, rounds: int) -> list[dict]:
    """Every configuration's round in turn, ``rounds`` times (slow phases of a shared machine hit
    all of them alike); tokens/s from each configuration's median round."""
    for _ in range(rounds):
        for _, timed in runs:
            timed()
    rows = [row for row, _ in runs]
    for row in rows:
        row["tokens_per_s"] = sum(map(len, row["tokens"])) / statistics.median(row["round_s"])
    return rows


def linear_name(mesh) -> str:
    """What --linear resolves to here, with the kernel's status when it is not used."""
    from mtpspec.kernels import cpu_linear
    from mtpspec.models.inference import resolve_linear

    chosen = resolve_linear(FLAGS.linear, sharded=mesh is not None)
    ok, why = cpu_linear.status()
    return f"{chosen!r}" if chosen == "ffi" or ok else f"{chosen!r} (C++ kernel: {why})"


def demo(mesh=None):
    config, params = checkpoints.load(FLAGS.checkpoint, mesh=mesh)
    tok = cli.tokenizer_for(config, FLAGS.checkpoint)
    texts = cli.demo_texts()
    prompts = [tok.encode(t) for t in texts]
    kw = dict(max_new_tokens=FLAGS.max_new_tokens, mesh=mesh, linear=FLAGS.linear)
    commit = cli.one(cli.commits(), "commit")
    print(
        f"model: {FLAGS.checkpoint} ({config.num_layers} layers, H={config.hidden_size}, "
        f"vocabulary {config.vocab_size}); {len(prompts)} held-out prompts, "
        f"{kw['max_new_tokens']} new tokens each; linear {linear_name(mesh)}"
    )
    runs = [run(config, params, prompts, "none", 0, commit, **kw)]
    for proposer in ("mtp", "ngram"):
        for k in cli.num_drafts():
            runs.append(run(config, params, prompts, proposer, k, commit, **kw))
    rows = round_robin(runs, FLAGS.rounds)
    base = rows[0]
    print("\n--- prompt (held-out) ---\n" + texts[0])
    print("--- greedy continuation ---\n" + tok.decode(base["tokens"][0]))
    print(f"\n{'decoding':<22} {'tok/s':>8} {'speedup':>8} {'tau':>6} {'compile s':>10}  same")
    for r in rows:
        plain = r["proposer"] == "none"
        name = "plain greedy" if plain else f"{r['proposer']} k={r['num_draft']} {r['commit']}"
        r["speedup"] = r["tokens_per_s"] / base["tokens_per_s"]
        tau = "-" if plain else f"{r['tau']:.2f}"
        print(
            f"{name:<22} {r['tokens_per_s']:>8.1f} {r['speedup']:>7.2f}x {tau:>6} "
            f"{r['compile_s']:>10.1f}  {r['tokens'] == base['tokens']}"
        )
    print(
        f"(tok/s over all prompts at batch 1, compile excluded; median of {FLAGS.rounds} rounds "
        "run round-robin in this run)"
    )
    return rows


def single(mesh=None):
    config, params = checkpoints.load(FLAGS.checkpoint, mesh=mesh)
    if FLAGS.prompt_ids:
        prompt, tok = [int(x) for x in FLAGS.prompt_ids], None
    else:
        text = FLAGS.prompt
        if FLAGS.prompt_file:
            text = pathlib.Path(FLAGS.prompt_file).read_text()
        if not text:
            raise app.UsageError("give --prompt, --prompt_file or --prompt_ids (or --demo)")
        tok = cli.tokenizer_for(config, FLAGS.checkpoint)
        prompt = tok.encode(text)
    spec = spec_config(
        cli.one(cli.proposers(), "proposer"),
        cli.one(cli.num_drafts(), "num_draft"),
        cli.one(cli.commits(), "commit"),
    )
    result = mtpspec.generate(
        config, params, [prompt], max_new_tokens=FLAGS.max_new_tokens, speculative=spec,
        temperature=FLAGS.temperature, top_k=FLAGS.top_k, top_p=FLAGS.top_p, seed=FLAGS.seed,
        linear=FLAGS.linear,
        mesh=mesh,
    )  # fmt: skip
    out = result.tokens[0]
    print(tok.decode(out) if tok else out)
    if not out:  # max_new_tokens=0: nothing ran, so there is no rate or tau to report
        print(f"\nno tokens generated (max_new_tokens={FLAGS.max_new_tokens})")
    else:
        print(
            f"\ntau {result.stats['tau']:.2f}, {result.stats['tokens_per_s']:.1f} tok/s "
            f"(compile {result.stats['compile_s']:.1f} s), stop: {result.stop_reasons[0]}"
        )
    return [{"tokens": out, **{k: v for k, v in result.stats.items() if k != "accepted"}}]


def main(argv):
    del argv
    mesh = cli.setup_mesh()
    rows = demo(mesh) if FLAGS.demo else single(mesh)
    cli.write_json(rows)


if __name__ == "__main__":
    app.run(main)
