"""Generate text with plain or speculative decoding; ``--demo`` compares them on the default model.

    python -m experiments.generate --prompt="def fib(n):" --proposer=mtp --num_draft=3
    python -m experiments.generate --checkpoint=tests/fixtures/hf/qwen3_next --prompt_ids=1,2,3
    python -m experiments.generate --demo            # what `make demo` runs
    python -m experiments.generate --demo --mesh=2x4 # sharded (see experiments/mesh_flags.py)

--checkpoint is an mtpspec checkpoint (``checkpoints.save_params``: config.json + params/) or an HF
directory (config.json + safetensors). Text goes through the byte tokenizer when the vocabulary is
256, else through the checkpoint's tokenizer.json (needs the ``tokenizers`` package).
Speed figures exclude compilation (reported separately) and are measured in this one run.
"""

from __future__ import annotations

import json
import pathlib

from absl import app, flags

import mtpspec
from experiments import mesh_flags
from mtpspec import checkpoints
from mtpspec.training.data import ByteTokenizer, HFTokenizer

ASSETS = pathlib.Path(__file__).resolve().parent.parent / "mtpspec" / "assets"
FLAGS = flags.FLAGS
flags.DEFINE_string("checkpoint", str(ASSETS / "default_model"), "Model directory.")
flags.DEFINE_enum("proposer", "mtp", ["none", "mtp", "ngram"], "Draft proposer (none = plain).")
flags.DEFINE_integer(
    "num_draft", 2, "k drafts per verify step (2 measured best for the default model)."
)
flags.DEFINE_enum("commit", "states", ["scan", "states", "replay"], "GDN commit strategy.")
flags.DEFINE_float("temperature", 0.0, "0 = greedy.")
flags.DEFINE_integer("top_k", 0, "Top-k filter (0 = off).")
flags.DEFINE_float("top_p", 1.0, "Nucleus filter.")
flags.DEFINE_integer("seed", 0, "Sampling seed.")
flags.DEFINE_string("prompt", None, "Prompt text.")
flags.DEFINE_string("prompt_file", None, "File whose text is the prompt.")
flags.DEFINE_list("prompt_ids", None, "Prompt as token ids (no tokenizer needed).")
flags.DEFINE_integer("max_new_tokens", 128, "Tokens to generate.")
flags.DEFINE_bool("demo", False, "Compare plain greedy, MTP and n-gram on held-out prompts.")
flags.DEFINE_list("demo_ks", None, "With --demo: the k values to compare (default: --num_draft).")
flags.DEFINE_string("json_out", None, "Write results as JSON here.")


def tokenizer_for(config, path):
    if config.vocab_size == 256:
        return ByteTokenizer()
    return HFTokenizer(path)


def spec_config(proposer: str, k: int, commit: str):
    return None if proposer == "none" else mtpspec.SpecConfig(proposer, k, commit)


def run(config, params, prompts, proposer, k, commit, **kw):
    """Generate for each prompt at batch 1 (warm-up compile first); totals over the prompts."""
    spec = spec_config(proposer, k, commit)
    first = mtpspec.generate(config, params, prompts[:1], speculative=spec, **kw)  # compile
    results = [mtpspec.generate(config, params, [p], speculative=spec, **kw) for p in prompts]
    tokens = sum(len(r.tokens[0]) for r in results)
    seconds = sum(r.stats["run_s"] for r in results)
    steps = sum(r.stats["steps"][0] for r in results)
    emitted = tokens - len(results)  # the prefill token is not from a verify step
    return {
        "proposer": proposer,
        "num_draft": k if spec else 0,
        "commit": commit if spec else None,
        "tokens": [r.tokens[0] for r in results],
        "tokens_per_s": tokens / seconds,
        "tau": emitted / max(steps, 1),
        "compile_s": first.stats["compile_s"],
    }


def demo(mesh=None):
    config, params = checkpoints.load(FLAGS.checkpoint, mesh=mesh)
    tok = tokenizer_for(config, FLAGS.checkpoint)
    spec_file = json.loads((ASSETS / "demo_prompts.json").read_text())
    texts = [p["text"] for p in spec_file["prompts"]]
    prompts = [tok.encode(t) for t in texts]
    kw = dict(max_new_tokens=FLAGS.max_new_tokens, mesh=mesh)
    print(
        f"model: {FLAGS.checkpoint} ({config.num_layers} layers, H={config.hidden_size}, "
        f"byte vocabulary); {len(prompts)} held-out prompts, {kw['max_new_tokens']} new tokens each"
    )
    rows = [run(config, params, prompts, "none", 0, "scan", **kw)]
    ks = [int(k) for k in FLAGS.demo_ks] if FLAGS.demo_ks else [FLAGS.num_draft]
    for proposer in ("mtp", "ngram"):
        for k in ks:
            rows.append(run(config, params, prompts, proposer, k, FLAGS.commit, **kw))
    base = rows[0]
    print("\n--- prompt (held-out) ---\n" + texts[0])
    print("--- greedy continuation ---\n" + tok.decode(base["tokens"][0]))
    print(f"\n{'decoding':<22} {'tok/s':>8} {'speedup':>8} {'tau':>6} {'compile s':>10}  same")
    for r in rows:
        name = (
            "plain greedy"
            if r["proposer"] == "none"
            else f"{r['proposer']} k={r['num_draft']} {r['commit']}"
        )
        same = r["tokens"] == base["tokens"]
        r["speedup"] = r["tokens_per_s"] / base["tokens_per_s"]
        tau = "-" if r["proposer"] == "none" else f"{r['tau']:.2f}"
        print(
            f"{name:<22} {r['tokens_per_s']:>8.1f} {r['speedup']:>7.2f}x {tau:>6} "
            f"{r['compile_s']:>10.1f}  {same}"
        )
    print("(tok/s over all prompts at batch 1, compile excluded, measured in this run)")
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
        tok = tokenizer_for(config, FLAGS.checkpoint)
        prompt = tok.encode(text)
    result = mtpspec.generate(
        config, params, [prompt], max_new_tokens=FLAGS.max_new_tokens,
        speculative=spec_config(FLAGS.proposer, FLAGS.num_draft, FLAGS.commit),
        temperature=FLAGS.temperature, top_k=FLAGS.top_k, top_p=FLAGS.top_p, seed=FLAGS.seed,
        mesh=mesh,
    )  # fmt: skip
    out = result.tokens[0]
    print(tok.decode(out) if tok else out)
    print(
        f"\ntau {result.stats['tau']:.2f}, {result.stats['tokens_per_s']:.1f} tok/s "
        f"(compile {result.stats['compile_s']:.1f} s), stop: {result.stop_reasons[0]}"
    )
    return [{"tokens": out, **{k: v for k, v in result.stats.items() if k != "accepted"}}]


def main(argv):
    del argv
    mesh = mesh_flags.setup_mesh()
    rows = demo(mesh) if FLAGS.demo else single(mesh)
    if FLAGS.json_out:
        with open(FLAGS.json_out, "w") as f:
            json.dump(rows, f, indent=2)


if __name__ == "__main__":
    app.run(main)
