"""Real-size bench: load, memory, prefill, decode and the MTP iteration cost on a checkpoint.

    python -m experiments.make_real_size --out=/tmp/q35                 # the fixture (random)
    python -m experiments.bench_real_size --checkpoint=/tmp/q35 --draft_vocab=32768
    python -m experiments.bench_real_size --checkpoint=/tmp/q35 --llama_bench=BIN --gguf=F.gguf

Prints one JSON object (and writes it with ``--json_out``):

  weights                                    the matrices' storage (--weights: "stored", or
                                             "int8", opt-in and lossy: the reference's greedy
                                             then departs from transformers')
  kernels                                    the C++ kernels' settings (KernelSettings; with
                                             --prefill_activations=bfloat16 the prompt's forward
                                             takes bf16 activations: prefill_tok_s and the
                                             reference's Δ log p show what that changes)
  load_s, rss_after_load_gib, rss_peak_gib   load wall time (``checkpoints.load``, by default
                                             ``for_decoding=True``: one copy of the weights);
                                             resident set size (VmRSS, GiB) after load and the
                                             process's peak (getrusage)
  prefill_tok_s                              a --prompt_len prompt, median over --repeats
  greedy_head                                the LM head for greedy rows (--greedy_head:
                                             "screened", its argmax through an int8 screen, the
                                             same ids; or "full")
  decode_tok_s                               plain greedy, (n − 1) tokens ÷ (T(n) − T(1)) on a
                                             short prompt (its prefill and the first token
                                             subtracted), median over rounds
  decode_full_head_tok_s,                    with a screened head: plain greedy through the
  screened_vs_full_head                      full head, timed in the same rounds, and the
                                             ratio per round
  r[name]                                    iteration cost of MTP k drafts in plain steps:
                                             τ × T(spec) ÷ T(plain) per round-robin round,
                                             median and IQR; a trained head's speed-up is τ ÷ r
  tau, same_as_plain                         per configuration (speculative greedy must emit
                                             plain greedy's tokens)
  reference                                  against ``real_size_oracle.py``'s reference.npz
                                             when present: greedy identical, max |Δ log p|
  llama_cpp                                  llama-bench's pp / tg tok/s on --gguf (optional peer),
                                             one llama-bench repetition in each round-robin round
                                             (after mtpspec's jobs), median and per round
  vs_llama_cpp                               mtpspec ÷ llama.cpp per round (prefill, decode):
                                             each round's ratio, their median and IQR: ratios
                                             of figures measured minutes apart at most, not two
                                             figures from different phases of a shared machine
                                             (its bandwidth drifts 20-30 %). llama-bench's tg
                                             generates from an empty context, mtpspec's decode
                                             follows a 32-token prompt: at this size a step's
                                             cost is its weights, not its context

``--draft_vocab``: a ``draft_vocab.json`` (``experiments/draft_vocab.py``), or an int N for the N
lowest ids — a cost-only stand-in for checkpoints with random weights, where no text tells
which ids are frequent (the drafts' acceptance is then meaningless, their cost is not).
"""

from __future__ import annotations

import dataclasses
import json
import os
import resource
import shutil
import statistics
import subprocess
import time

import numpy as np
from absl import flags

from experiments import cli

FLAGS = flags.FLAGS
cli.define_checkpoint("HF checkpoint directory.", default=None, required=True)
flags.DEFINE_string("dtype", None, "Load as this dtype (default: the checkpoint's).")
flags.DEFINE_bool(
    "for_decoding",
    True,
    "Load straight into the decoding layout (DecodingWeights: one copy of the weights); "
    "--nofor_decoding loads the canonical tree (generate builds the decoding tree beside it).",
)
flags.DEFINE_enum(
    "weights",
    "stored",
    ["stored", "int8"],
    "The matrices' storage (for_decoding only): the checkpoint's own, or per-column int8 "
    "(opt-in, lossy: experiments/int8_report.py measures what it changes).",
)
flags.DEFINE_enum(
    "greedy_head",
    "auto",
    ["auto", "screened", "full"],
    "The LM head for greedy rows (for_decoding only; inference.resolve_greedy_head): its argmax "
    "through an int8 screen, or the full logits'. With a screened head the bench also times "
    "plain decoding through the full head in every round (decode_full_head_tok_s).",
)
flags.DEFINE_integer("prompt_len", 512, "Prefill benchmark prompt length.")
flags.DEFINE_integer("new_tokens", 48, "Tokens per decode run.")
flags.DEFINE_integer("repeats", 2, "Round-robin rounds.")
cli.define_num_draft("1,2,3", "MTP k values to cost (comma list).")
flags.DEFINE_string("draft_vocab", None, "draft_vocab.json path, or an int N (the N lowest ids).")
flags.DEFINE_string("llama_bench", None, "llama.cpp's llama-bench binary (optional peer).")
flags.DEFINE_string("gguf", None, "The same checkpoint converted to GGUF, for --llama_bench.")
flags.DEFINE_enum(
    "prefill_activations",
    None,
    ["float32", "bfloat16"],
    "The prompt's forward with float32 or bf16 activations against bf16 weights "
    "(KernelSettings.prefill_activations; default: the settings in effect).",
)
cli.define_json_out()


def rss_gib() -> float:
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 2**20
    return float("nan")


def peak_gib() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 2**20


def quartiles(xs: list[float]) -> dict:
    if len(xs) < 2:
        return {"median": xs[0], "q1": xs[0], "q3": xs[0]}
    q1, q2, q3 = statistics.quantiles(xs, n=4, method="inclusive")
    return {"median": q2, "q1": q1, "q3": q3}


def load_draft_vocab(value: str | None, vocab_size: int):
    from mtpspec.decoding.draft_vocab import DraftVocab

    if value is None:
        return None
    if value.isdigit():
        n = int(value)
        if not 1 <= n <= vocab_size:
            raise ValueError(f"--draft_vocab={n} must lie in 1..{vocab_size}")
        return DraftVocab(np.arange(n), vocab_size=vocab_size, source=f"the {n} lowest ids")
    return DraftVocab.load(value)


def check_peer(binary: str | None, gguf: str | None) -> str | None:
    """--llama_bench and --gguf together, an executable (a path, or a name on PATH) and an
    existing file: refused before the load. Returns the executable's path."""
    if binary is None and gguf is None:
        return None
    if binary is None or gguf is None:
        raise ValueError("--llama_bench and --gguf go together (a peer and its checkpoint)")
    found = shutil.which(binary)
    if found is None:
        raise OSError(f"--llama_bench={binary}: no such executable (a path, or a name on PATH)")
    if not os.path.isfile(gguf):
        raise OSError(f"--gguf={gguf}: no such file")
    return found


def llama_cpp(binary: str, gguf: str, prompt_len: int, new: int) -> dict:
    """llama-bench's pp<prompt_len> and tg<new> tok/s (2 threads, 1 repetition)."""
    cmd = [binary, "-m", gguf, "-t", "2", "-p", str(prompt_len), "-n", str(new), "-r", "1"]
    out = subprocess.run([*cmd, "-o", "json"], capture_output=True, text=True, check=False)
    if out.returncode:
        raise OSError(f"llama-bench failed ({out.returncode}): {out.stderr.strip()[-300:]}")
    got = {}
    for r in json.loads(out.stdout):
        kind = "prefill" if r.get("n_prompt") else "decode"
        got[kind] = float(r["avg_ts"])
    if set(got) != {"prefill", "decode"}:
        raise OSError(f"llama-bench gave {sorted(got)}, not a pp and a tg row: {out.stdout[:300]}")
    return got


def timed(config, params, prompt, n, spec=None) -> tuple[float, list[int], float]:
    import mtpspec

    r = mtpspec.generate(config, params, [prompt], max_new_tokens=n, speculative=spec)
    return r.stats["run_s"], r.tokens[0], r.stats["tau"]


def main(argv):
    del argv
    peer_bin = check_peer(FLAGS.llama_bench, FLAGS.gguf)
    from mtpspec.kernels import settings

    ks = settings.current()
    if FLAGS.prefill_activations is not None:  # OSError on a CPU without AVX-512 BF16
        ks = dataclasses.replace(ks, prefill_activations=FLAGS.prefill_activations)
    with settings.use(ks) as ks:
        _main(peer_bin, dataclasses.asdict(ks))


def _main(peer_bin, kernels: dict):
    import jax

    import mtpspec
    from mtpspec import checkpoints

    t0 = time.perf_counter()
    config, params = checkpoints.load(
        FLAGS.checkpoint,
        dtype=FLAGS.dtype,
        for_decoding=FLAGS.for_decoding,
        weights=FLAGS.weights,
        greedy_head=FLAGS.greedy_head,
    )
    jax.block_until_ready(params.tree if FLAGS.for_decoding else params)
    screened = getattr(params, "greedy_head", None) == "screened"
    out = {
        "checkpoint": FLAGS.checkpoint,
        "dtype": config.dtype,
        "for_decoding": FLAGS.for_decoding,
        "weights": FLAGS.weights,
        "greedy_head": getattr(params, "greedy_head", "auto (the canonical tree's)"),
        "kernels": kernels,
    }
    out["load_s"], out["rss_after_load_gib"] = time.perf_counter() - t0, rss_gib()
    out["rss_peak_after_load_gib"] = peak_gib()
    vocab = load_draft_vocab(FLAGS.draft_vocab, config.vocab_size)
    ref = _reference(FLAGS.checkpoint)
    rng = np.random.default_rng(1)
    short = ref["input_ids"][0].tolist() if ref else rng.integers(0, config.vocab_size, 32).tolist()
    long = rng.integers(0, config.vocab_size, FLAGS.prompt_len).tolist()
    n = FLAGS.new_tokens

    configs = {"plain": None}
    for k in cli.num_drafts():
        configs[f"mtp k={k}"] = mtpspec.SpecConfig(num_draft=k)
        if vocab is not None:
            configs[f"mtp k={k} vocab={vocab.size}"] = mtpspec.SpecConfig(
                num_draft=k, draft_vocab=vocab
            )
    jobs = {
        "prefill": lambda: timed(config, params, long, 1),
        "first": lambda: timed(config, params, short, 1),
    }
    for name, spec in configs.items():
        jobs[name] = lambda spec=spec: timed(config, params, short, n, spec)
    if screened:  # the same weights through the full head: the screen's gain in every round
        full = params.without_screen()
        jobs["plain full head"] = lambda: timed(config, full, short, n)
    for job in jobs.values():  # compile (and pack) everything before any timing
        job()
    out["rss_after_first_decode_gib"] = rss_gib()
    seconds = {name: [] for name in jobs}
    tokens, taus = {}, {}
    peer = []  # llama-bench's {prefill, decode} tok/s, one per round
    before = mtpspec.decoding.compile_count()
    for _ in range(FLAGS.repeats):
        for name, job in jobs.items():
            s, toks, tau = job()
            seconds[name].append(s)
            tokens[name], taus[name] = toks, tau
        if peer_bin:
            peer.append(llama_cpp(peer_bin, FLAGS.gguf, FLAGS.prompt_len, n))
    out["recompiles_while_timed"] = mtpspec.decoding.compile_count() - before
    out["prefill_tok_s"] = FLAGS.prompt_len / statistics.median(seconds["prefill"])
    decode = [(n - 1) / (p - f) for p, f in zip(seconds["plain"], seconds["first"])]
    out["decode_tok_s"] = quartiles(decode)
    if screened:
        ff = [(n - 1) / (p - f) for p, f in zip(seconds["plain full head"], seconds["first"])]
        out["decode_full_head_tok_s"] = quartiles(ff)
        out["screened_vs_full_head"] = quartiles([a / b for a, b in zip(decode, ff)])
        out["full_head_same_tokens"] = tokens["plain full head"] == tokens["plain"]
    plain_decode = [p - f for p, f in zip(seconds["plain"], seconds["first"])]
    out["configs"] = {}
    for name in configs:
        if name == "plain":
            continue
        r = [
            taus[name] * (s - f) / p
            for s, f, p in zip(seconds[name], seconds["first"], plain_decode)
        ]
        out["configs"][name] = {
            "r": quartiles(r),
            "tau": taus[name],
            "same_as_plain": tokens[name] == tokens["plain"],
        }
    if ref:
        out["reference"] = _against_reference(config, params, ref)
    if peer:
        out.update(_vs_peer(peer, [FLAGS.prompt_len / s for s in seconds["prefill"]], decode, n))
    out["rss_peak_gib"] = peak_gib()
    print(json.dumps(out, indent=1))
    if FLAGS.json_out:
        cli.write_json(out)


def _vs_peer(peer: list, prefill: list, decode: list, n: int) -> dict:
    """llama-bench's figures (one per round) and mtpspec ÷ llama.cpp per round."""
    ours = {"prefill": prefill, "decode": decode}
    names = {"prefill": f"pp{FLAGS.prompt_len}", "decode": f"tg{n}"}
    out = {
        "llama_cpp": {
            names[k]: {
                "tok_s": statistics.median(p[k] for p in peer),
                "per_round": [p[k] for p in peer],
            }
            for k in names
        },
        "vs_llama_cpp": {},
    }
    for k in names:
        ratios = [a / p[k] for a, p in zip(ours[k], peer, strict=True)]
        out["vs_llama_cpp"][k] = {**quartiles(ratios), "per_round": ratios}
    return out


def _reference(path: str):
    import pathlib

    f = pathlib.Path(path) / "reference.npz"
    return dict(np.load(f)) if f.is_file() else None


def _against_reference(config, params, ref) -> dict:
    """Greedy from the reference prompt against transformers' float32 run on the same weights."""
    import mtpspec

    want = ref["greedy"].tolist()
    r = mtpspec.generate(
        config,
        params,
        [ref["input_ids"][0].tolist()],
        max_new_tokens=len(want),
        return_logprobs=True,
    )
    got = r.tokens[0]
    same = next((i for i, (a, b) in enumerate(zip(got, want)) if a != b), len(want))
    dlogp = np.abs(np.asarray(r.logprobs[0][:same]) - ref["greedy_logp"][:same])
    # without log-probabilities a screened head gives the greedy ids through its screen
    ids = mtpspec.generate(config, params, [ref["input_ids"][0].tolist()], max_new_tokens=len(want))
    return {
        "greedy_identical": got == want,
        "greedy_identical_without_logprobs": ids.tokens[0] == want,
        "first_difference": None if got == want else same,
        "max_abs_logp_diff": float(dlogp.max()) if same else None,
    }


if __name__ == "__main__":
    cli.run(main)
