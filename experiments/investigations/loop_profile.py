"""Where one iteration of the compiled decoding loop spends its time, thunk by thunk: the native
kernels by target, and XLA's own fusions ("glue") by the source function that emitted them.

    python -m experiments.investigations.loop_profile --config=mtp:3
    python -m experiments.investigations.loop_profile --config=none --depth=1 --top=15
    python -m experiments.investigations.loop_profile --config=mtp:1x1x1x2     # a draft tree

Runs the first demo prompt (batch 1, ``--max_new_tokens``) twice to compile and warm, a third time
under ``jax.profiler``; then reads the trace's per-thunk durations and the HLO of that same
compiled program (the program cache's entry), and reports per loop iteration the median of every
thunk that ran once (or a fixed number of times) per iteration:

- each FFI target (the C++ linear split by its row count), and the glue in all;
- the glue by source: the innermost ``--depth`` functions of the stack XLA kept for each fusion
  (``?``: copies and other thunks XLA made without a source frame).

Medians under the profiler run a little slower than without it; compare configurations within one
run of this script, or ratios. Not for unit tests (timings).
"""

from __future__ import annotations

import collections
import glob
import gzip
import json
import re
import statistics
import tempfile

import jax
import numpy as np
from absl import app, flags

from experiments import cli
from mtpspec import checkpoints, decoding

FLAGS = flags.FLAGS
cli.define_checkpoint()
flags.DEFINE_string(
    "config", "mtp:3", "proposer:k, proposer:b1xb2x... or proposer:tree=b1 (a tree), or none."
)
flags.DEFINE_integer("max_new_tokens", 128, "New tokens.")
flags.DEFINE_integer(
    "draft_vocab", 0, "MTP drafts among the N lowest ids (0: the whole vocabulary)."
)
flags.DEFINE_string("commit", "replay", "GDN commit strategy: replay, states or scan.")
flags.DEFINE_integer("depth", 2, "Innermost source functions that name a glue fusion.")
flags.DEFINE_integer("top", 25, "Glue sources to list.")

SKIP = ("$", "Thunk", "while", "Pjit", "Common", "end:", "Threadpool", "PjRt")


def _table(lines: list[str], name: str) -> dict[int, str]:
    out, i = {}, lines.index(name)
    for line in lines[i + 1 :]:
        m = re.match(r"(\d+) (.*)", line)
        if not m:
            break
        out[int(m.group(1))] = m.group(2)
    return out


def source_frames(hlo: str) -> dict[str, list[str]]:
    """Instruction name -> its source functions, innermost first (HLO's stack frame tables)."""
    lines = hlo.splitlines()
    if "StackFrames" not in lines:
        return {}
    funcs = {k: v.strip('"') for k, v in _table(lines, "FunctionNames").items()}
    locs = {}
    for k, v in _table(lines, "FileLocations").items():
        locs[k] = funcs[int(re.search(r"function_name_id=(\d+)", v).group(1))]
    frames = {}
    for k, v in _table(lines, "StackFrames").items():
        m = re.search(r"file_location_id=(\d+) parent_frame_id=(\d+)", v)
        frames[k] = (int(m.group(1)), int(m.group(2)))

    def chain(fid):
        out, seen = [], set()
        while fid in frames and fid not in seen:
            seen.add(fid)
            loc, parent = frames[fid]
            out.append(locs[loc])
            fid = parent
        return out

    found = {}
    for m in re.finditer(r"^\s+%([\w.\-]+) = .*?stack_frame_id=(\d+)", hlo, re.M):
        found.setdefault(m.group(1), chain(int(m.group(2))))
    return found


def ffi_targets(hlo: str) -> dict[str, str]:
    """FFI call name -> target (the linear with its row count)."""
    out = {}
    pattern = r"%(ffi_call[.\d]*) = (\S+|\([^)]*\)) custom-call\(.*?custom_call_target=\"(\w+)\""
    for m in re.finditer(pattern, hlo):
        name, shape, target = m.groups()
        if target == "mtpspec_cpu_linear":
            rows = re.match(r"f32\[(\d+),", shape)
            target = f"linear, {rows.group(1) if rows else '?'} rows"
        out[name] = target
    return out


def thunk_medians(trace_dir: str, per: int) -> dict[str, tuple[float, int]]:
    """Thunk name -> (median µs × calls per iteration, calls per iteration), for thunks whose call
    count is a multiple of ``per`` (the loop's iterations)."""
    path = glob.glob(trace_dir + "/**/*.json.gz", recursive=True)[0]
    data = json.load(gzip.open(path))
    events = data["traceEvents"] if isinstance(data, dict) else data
    durs = collections.defaultdict(list)
    for e in events:
        if e.get("ph") == "X" and not e["name"].startswith(SKIP):
            durs[e["name"]].append(e["dur"])
    return {
        n: (statistics.median(v) * len(v) / per, len(v) // per)
        for n, v in durs.items()
        if len(v) >= per and len(v) % per == 0
    }


def main(argv):
    del argv
    config, params = checkpoints.load(FLAGS.checkpoint, for_decoding=True)
    try:
        prompt = cli.tokenizer_for(config, FLAGS.checkpoint).encode(cli.demo_texts()[0])
    except OSError:  # no tokenizer (the real-size fixture): the prompt's bytes as ids
        prompt = list(cli.demo_texts()[0].encode())
    proposer, _, k = FLAGS.config.partition(":")
    spec = None
    if proposer != "none":
        if not k:
            raise app.UsageError(f"--config: {FLAGS.config!r} is not none or proposer:k")
        tree = cli.parse_tree(k.removeprefix("tree="), "--config") if "x" in k or "=" in k else None
        if tree is None and not k.isdigit():
            raise app.UsageError(f"--config: {FLAGS.config!r}: k must be an int (mtp:3)")
        vocab = None
        if FLAGS.draft_vocab:
            ids = np.arange(FLAGS.draft_vocab)
            vocab = decoding.DraftVocab(ids, vocab_size=config.vocab_size, source="lowest ids")
        spec = decoding.SpecConfig(
            proposer, len(tree) if tree else int(k), FLAGS.commit, tree=tree, draft_vocab=vocab
        )

    def go():
        return decoding.generate(
            config, params, [prompt], max_new_tokens=FLAGS.max_new_tokens, speculative=spec
        )

    go(), go()
    trace_dir = tempfile.mkdtemp(prefix="loop_profile_")
    with jax.profiler.trace(trace_dir, create_perfetto_trace=True):
        result = go()
    iters = sum(result.stats["steps"])
    prep = decoding.prepare(
        config, params, [prompt], max_new_tokens=FLAGS.max_new_tokens, speculative=spec
    )
    compiled, _ = prep.compiled()  # the program cache's entry: the very program traced above
    hlo = compiled.as_text()
    targets, frames = ffi_targets(hlo), source_frames(hlo)
    kinds, glue, calls = collections.Counter(), collections.Counter(), collections.Counter()
    for name, (us, n) in thunk_medians(trace_dir, iters).items():
        if name.startswith("ffi_call"):
            kinds[targets.get(name, "ffi (unknown target)")] += us
            continue
        kinds["XLA glue"] += us
        fr = []
        for f in frames.get(name, []):  # a function at several lines appears once
            if f not in ("run", "<module>") and (not fr or fr[-1] != f):
                fr.append(f)
        fr = fr[: FLAGS.depth]
        key = " < ".join(fr) if fr else "?"
        glue[key] += us
        calls[key] += n
    print(f"{FLAGS.config}: {iters} loop iterations; µs per iteration (medians under the profiler)")
    for kind, us in kinds.most_common():
        print(f"  {us:8.1f}  {kind}")
    print(f"  {sum(kinds.values()):8.1f}  in all")
    print(f"XLA glue by source (innermost {FLAGS.depth}; thunks per iteration):")
    for key, us in glue.most_common(FLAGS.top):
        print(f"  {us:8.1f}  {calls[key]:4d}  {key}")


if __name__ == "__main__":
    cli.run(main)
