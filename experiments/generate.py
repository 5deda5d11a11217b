"""Generate text with plain or speculative decoding; ``--demo`` compares them on the default model.

    python -m experiments.generate --prompt="def fib(n):" --proposer=mtp --num_draft=3
    python -m experiments.generate --checkpoint=DIR --chat --prompt="Hi!" --system="Be terse."
    python -m experiments.generate --checkpoint=DIR --prompt_file=p.txt --proposer=draft \
        --draft_checkpoint=SMALL_DIR --json_out=out.json
    python -m experiments.generate --checkpoint=tests/fixtures/hf/qwen3_next --prompt_ids=1,2,3
    python -m experiments.generate --demo                  # what `make demo` runs
    python -m experiments.generate --demo --num_draft=1,2,3,4
    python -m experiments.generate --demo --mesh=2x4       # sharded (experiments/cli.py)

--checkpoint is an mtpspec checkpoint (``checkpoints.save_params``: config.json + params/) or an HF
directory (config.json + safetensors + tokenizer files). Text goes through the checkpoint's own
tokenizer (``checkpoints.load_tokenizer``: tokenizer.json, else bytes for the 256 vocabulary);
``--chat`` renders the prompt as a user turn with the checkpoint's chat template. Generation stops
at the checkpoint's EOS ids (generation_config.json, config.json, tokenizer) unless ``--eos`` says
otherwise, and at any ``--stop`` string. The prompt is echoed, the continuation streamed as each
verify step is accepted (``--nostream``: one on-device call, exact timing), and third-party INFO
logging is silenced (``--verbose`` keeps it). ``--json_out`` writes the prompt, text, tokens, stop
reason and statistics. Speed figures exclude compilation (reported separately) and are measured in
this one run.
"""

from __future__ import annotations

import pathlib
import statistics

from absl import app, flags

import mtpspec
from experiments import cli
from mtpspec import checkpoints
from mtpspec import text as text_api
from mtpspec.analysis import CompileCounter, MachineLoad, per_round_speedup, quick_checks
from mtpspec.decoding.stats import pooled

FLAGS = flags.FLAGS
cli.define_checkpoint()
cli.define_draft_checkpoint()
cli.define_speculation()
cli.define_tree(
    help_text="A draft tree b1xb2x... (e.g. 2x2x1) for a single run: the proposer "
    "drafts b_i children per node at depth i (num_draft = its depth)."
)
cli.define_linear()
cli.define_attention()
cli.define_json_out()
cli.define_mesh()
flags.DEFINE_float("temperature", 0.0, "0 = greedy.")
flags.DEFINE_integer("top_k", 0, "Top-k filter (0 = off).")
flags.DEFINE_float("top_p", 1.0, "Nucleus filter.")
flags.DEFINE_float("min_p", 0.0, "Min-p filter: keep tokens with p >= min_p * p_max (0 = off).")
flags.DEFINE_integer("seed", 0, "Sampling seed.")
flags.DEFINE_string("prompt", None, "Prompt text.")
flags.DEFINE_string("prompt_file", None, "File whose text is the prompt.")
flags.DEFINE_list("prompt_ids", None, "Prompt as token ids (no tokenizer needed).")
flags.DEFINE_bool("chat", False, "Render the prompt as a user turn with the chat template.")
flags.DEFINE_string("system", None, "--chat: a system message before the user turn.")
flags.DEFINE_string(
    "eos", "auto", "Stop ids: auto (the checkpoint's EOS ids), none, or a comma list of ids."
)
flags.DEFINE_multi_string("stop", [], "Stop string (repeatable); the text ends before it.")
flags.DEFINE_enum(
    "dtype", "float32", ["float32", "bfloat16", "auto"],
    "Weights of an HF checkpoint: float32, bfloat16, or auto (as stored). bf16 is several "
    "times slower than f32 on AVX2 CPUs.",
)  # fmt: skip
flags.DEFINE_bool("stream", True, "Print the text as it is accepted (else one on-device call).")
flags.DEFINE_bool("verbose", False, "Keep absl / orbax / JAX INFO logging.")
flags.DEFINE_integer("max_new_tokens", 128, "Tokens to generate.")
flags.DEFINE_integer("rounds", 5, "--demo: timed rounds per configuration, run round-robin.")
flags.DEFINE_bool(
    "demo", False, "Compare plain greedy, MTP and n-gram (each --num_draft) on held-out prompts."
)
# Checked while the flags are parsed, before any model loads: a bad value ends in one line (cli.run)
# instead of after loading, compiling and echoing the prompt. The library checks the same ranges.
for _name, _ok, _rule in (
    ("max_new_tokens", lambda v: v >= 0, ">= 0"),
    ("rounds", lambda v: v >= 1, ">= 1"),
    ("temperature", lambda v: 0 <= v < float("inf"), "finite and >= 0"),
    ("top_k", lambda v: v >= 0, ">= 0 (0 = off)"),
    ("top_p", lambda v: 0 < v <= 1, "in (0, 1]"),
    ("min_p", lambda v: 0 <= v <= 1, "in [0, 1] (0 = off)"),
):
    flags.register_validator(_name, _ok, f"--{_name} must be {_rule}")


def spec_config(proposer: str, k: int, commit: str):
    return None if proposer == "none" else mtpspec.SpecConfig(proposer, k, commit)


def run(config, params, prompts, proposer, k, commit, **kw):
    """One configuration: compiled (warm-up), then ``timed()`` decodes every prompt at batch 1
    and returns the seconds of that round (device time, compile excluded)."""
    spec = spec_config(proposer, k, commit)
    first = mtpspec.generate(config, params, prompts[:1], speculative=spec, **kw)  # compile
    row = {
        "name": f"{proposer} k={k} {commit}" if spec else "plain greedy",
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


def round_robin(runs, rounds: int) -> tuple[list[dict], float, int]:
    """Every configuration's round in turn, ``rounds`` times (slow phases of a shared machine hit
    all of them alike); tokens/s from each configuration's median round, and the speed-up over
    the first configuration (plain greedy) with the IQR of its per-round ratios. Also returns
    the share of the CPU other processes took meanwhile (``analysis.MachineLoad``) and the
    compiles after the first round (a prompt's first length bucket may compile in round one)."""
    recompiles = 0
    with MachineLoad() as load:
        for i in range(rounds):
            with CompileCounter() as counter:
                for _, timed in runs:
                    timed()
            if i:
                recompiles += counter.count
    rows = [row for row, _ in runs]
    base = rows[0]
    for row in rows:
        row["tokens_per_s"] = sum(map(len, row["tokens"])) / statistics.median(row["round_s"])
        share = sum(map(len, row["tokens"])) / sum(map(len, base["tokens"]))
        row["speedup"], *iqr = per_round_speedup(row["round_s"], base["round_s"], share)
        row["speedup_iqr"] = tuple(iqr)
    return rows, load.other, recompiles


def linear_name(mesh) -> str:
    """What --linear resolves to here, with the kernel's status when it is not used."""
    from mtpspec.kernels import cpu_linear
    from mtpspec.models.inference import resolve_linear

    chosen = resolve_linear(FLAGS.linear, sharded=mesh is not None)
    ok, why = cpu_linear.status()
    if chosen == "ffi":
        return f"{chosen!r} ({dict(avx2='AVX2', avx512='AVX-512')[cpu_linear.isa_name()]})"
    return f"{chosen!r}" if ok else f"{chosen!r} (C++ kernel: {why})"


def demo(mesh=None):
    config, params = checkpoints.load(FLAGS.checkpoint, mesh=mesh)
    tok = cli.tokenizer_for(config, FLAGS.checkpoint)
    texts = cli.demo_texts()
    prompts = [tok.encode(t) for t in texts]
    kw = dict(
        max_new_tokens=FLAGS.max_new_tokens, mesh=mesh, linear=FLAGS.linear,
        attention=FLAGS.attention,
    )  # fmt: skip
    if FLAGS.tree:
        raise app.UsageError("--demo sweeps chains (--num_draft); --tree is for a single run")
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
    rows, other_cpu, recompiles = round_robin(runs, FLAGS.rounds)
    base = rows[0]
    print("\n--- prompt (held-out) ---\n" + texts[0])
    print("--- greedy continuation ---\n" + tok.decode(base["tokens"][0]))
    print(
        f"\n{'decoding':<22} {'tok/s':>8} {'speedup':>8} {'(IQR)':>11} {'tau':>6} "
        f"{'compile s':>10}  same"
    )
    for r in rows:
        plain = r["proposer"] == "none"
        tau = "-" if plain else f"{r['tau']:.2f}"
        iqr = "" if plain else "({:.2f}-{:.2f})".format(*r["speedup_iqr"])
        print(
            f"{r['name']:<22} {r['tokens_per_s']:>8.1f} {r['speedup']:>7.2f}x {iqr:>11} {tau:>6} "
            f"{r['compile_s']:>10.1f}  {r['tokens'] == base['tokens']}"
        )
    print(
        f"(tok/s over all prompts at batch 1, compile excluded; median of {FLAGS.rounds} rounds "
        "run round-robin in this run; IQR: of the per-round speed-ups against the same round's "
        f"plain greedy)\nother processes and steal during the rounds: {other_cpu:.0%} of the CPU"
    )
    invalid = quick_checks(rows, recompiles)
    best = max(rows[1:], key=lambda r: r["speedup"], default=None)
    if invalid:
        print("INVALID RUN (self-checks failed; the figures above are not a result):")
        print("".join(f"  - {why}\n" for why in invalid), end="")
    elif best is not None:
        print(
            f"best: {best['proposer']} k={best['num_draft']} at {best['speedup']:.2f}x plain "
            "greedy (IQR {:.2f}-{:.2f}), tokens identical".format(*best["speedup_iqr"])
        )
    return rows


def quiet_logging() -> None:
    """Third-party INFO lines (absl, orbax, JAX) off: only warnings and errors remain."""
    import logging

    from absl import logging as absl_logging

    absl_logging.set_verbosity(absl_logging.WARNING)
    for name in ("absl", "orbax", "jax", "jax._src"):
        logging.getLogger(name).setLevel(logging.WARNING)


def eos_ids():
    """--eos: auto (``text_api.AUTO``: the checkpoint tokenizer's EOS ids), none, or ids."""
    if FLAGS.eos == "auto":
        return text_api.AUTO
    if FLAGS.eos == "none":
        return None
    try:
        return [int(x) for x in FLAGS.eos.split(",")]
    except ValueError as e:
        raise app.UsageError(f"--eos must be auto, none or comma-separated ids: {FLAGS.eos}") from e


def speculation(config):
    """The SpecConfig of --proposer / --num_draft / --commit / --tree (--draft_checkpoint for
    draft); with --tree, num_draft is the tree's depth."""
    proposer = cli.one(cli.proposers(), "proposer")
    k, commit = cli.one(cli.num_drafts(), "num_draft"), cli.one(cli.commits(), "commit")
    trees = cli.trees()
    tree = cli.one(trees, "tree") if trees else None
    if proposer == "none":
        if tree:
            raise app.UsageError("--tree needs a proposer (--proposer=mtp, ngram or draft)")
        return None
    k = len(tree) if tree else k
    if proposer != "draft":
        return mtpspec.SpecConfig(proposer, k, commit, tree=tree)
    if not FLAGS.draft_checkpoint:
        raise app.UsageError("--proposer=draft needs --draft_checkpoint=DIR")
    dconfig, dparams = checkpoints.load(FLAGS.draft_checkpoint, dtype=dtype_arg())
    return mtpspec.SpecConfig(
        "draft", k, commit, tree=tree, draft_config=dconfig, draft_params=dparams
    )


def dtype_arg():
    return None if FLAGS.dtype == "auto" else FLAGS.dtype


def read_prompt(config, tok) -> tuple[list[int], str | None]:
    """(ids, prompt text shown) from --prompt_ids / --prompt / --prompt_file (+ --chat)."""
    if FLAGS.prompt_ids:
        return [int(x) for x in FLAGS.prompt_ids], None
    text = FLAGS.prompt
    if FLAGS.prompt_file:
        text = pathlib.Path(FLAGS.prompt_file).read_text(encoding="utf-8", errors="surrogateescape")
    if not text:
        raise app.UsageError("give --prompt, --prompt_file or --prompt_ids (or --demo)")
    if FLAGS.chat:
        ids = text_api.chat_prompt(tok, text, system=FLAGS.system)
        return ids, tok.decode(ids, skip_special_tokens=False)
    return tok.encode(text), text


def single(mesh=None):
    import sys

    config, params = checkpoints.load(FLAGS.checkpoint, mesh=mesh, dtype=dtype_arg())
    tok = cli.tokenizer_for(config, FLAGS.checkpoint)
    prompt, shown = read_prompt(config, tok)
    options = dict(
        max_new_tokens=FLAGS.max_new_tokens, speculative=speculation(config),
        temperature=FLAGS.temperature, top_k=FLAGS.top_k, top_p=FLAGS.top_p, min_p=FLAGS.min_p,
        seed=FLAGS.seed, eos_id=eos_ids(), linear=FLAGS.linear, attention=FLAGS.attention,
        mesh=mesh,
    )  # fmt: skip
    if FLAGS.max_new_tokens == 0:
        print(f"no tokens generated (max_new_tokens={FLAGS.max_new_tokens})")
        result = text_api.TextResult("", [], "length", {})
    else:
        print(shown if shown is not None else prompt, end="" if shown else "\n", flush=True)
        print(
            "\n[compiling the decoding program for this shape...]" if shown else "[compiling...]",
            file=sys.stderr, flush=True,
        )  # fmt: skip
        if FLAGS.stream:
            stream = text_api.TextStream(config, params, tok, prompt, stop=FLAGS.stop, **options)
            for piece in stream:
                print(piece, end="", flush=True)
            result = stream.result
        else:
            result = text_api.complete(config, params, tok, prompt, stop=FLAGS.stop, **options)
            print(result.text, end="")
        st = result.stats
        print(
            f"\n\n[stop: {result.stop_reason}; {len(result.tokens)} tokens; tau "
            f"{st['tau']:.2f}; {st['tokens_per_s']:.1f} tok/s"
            + (f", compile {st['compile_s']:.1f} s" if "compile_s" in st else "")
            + "]"
        )
    stats = {k: v for k, v in result.stats.items() if k != "accepted"}
    return {
        "checkpoint": FLAGS.checkpoint,
        "prompt": shown,
        "prompt_ids": prompt,
        "text": result.text,
        "tokens": result.tokens,
        "stop_reason": result.stop_reason,
        "stats": stats,
    }


def main(argv):
    del argv
    if not FLAGS.verbose:
        quiet_logging()
    mesh = cli.setup_mesh()
    rows = demo(mesh) if FLAGS.demo else single(mesh)
    cli.write_json(rows)


if __name__ == "__main__":
    cli.run(main)
