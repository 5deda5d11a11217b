"""Plain greedy with the C++ kernels against XLA's own path, quiet and beside a competing process
that this script starts itself (a busy loop at a chosen niceness), rounds interleaved.

    python -m experiments.investigations.contention --competitors=none,19,0 --rounds=6

Per competitor (``none``: nothing else running; a number: one ``while True: pass`` process at that
niceness, started before its rounds and killed after): each round times ``--max_new_tokens`` of
plain greedy on the first demo prompt at batch 1 once with ``linear=attention=ffi`` and once with
``xla``, in turn. Printed per competitor: the median and interquartile range of ms per token for
each path, the kernels' speed-up over XLA (median of the per-round ratios), and the share of CPU
time the machine spent outside this process during those rounds (``analysis.MachineLoad``: other
processes and steal), so a noisy run shows as one. Times are whole ``generate`` calls (prefill of
a short prompt included) divided by the new tokens.
"""

from __future__ import annotations

import statistics
import subprocess
import sys
import time

from absl import app, flags

from experiments import cli
from mtpspec import analysis, checkpoints, decoding

FLAGS = flags.FLAGS
cli.define_checkpoint()
flags.DEFINE_list("competitors", ["none", "19"], "none, or the niceness of a busy-loop process.")
flags.DEFINE_integer("rounds", 6, "Interleaved rounds per competitor.")
flags.DEFINE_integer("max_new_tokens", 128, "New tokens per timed call.")

PATHS = {"ffi": dict(linear="ffi", attention="ffi"), "xla": dict(linear="xla", attention="xla")}


def quartiles(values: list[float]) -> tuple[float, float, float]:
    q1, med, q3 = statistics.quantiles(values, n=4, method="inclusive")
    return q1, med, q3


def start_competitor(name: str):
    if name == "none":
        return None
    try:
        nice = int(name)
    except ValueError:
        raise app.UsageError(f"--competitors: {name!r} is not none or a niceness (0..19)") from None
    if not 0 <= nice <= 19:
        raise app.UsageError(f"--competitors: niceness {nice} is outside 0..19")
    code = f"import os; os.nice({nice})\nwhile True: pass"
    return subprocess.Popen([sys.executable, "-c", code])


def measure(config, params, prompt, competitor: str) -> dict:
    proc = start_competitor(competitor)
    try:
        times = {name: [] for name in PATHS}
        n = FLAGS.max_new_tokens
        with analysis.MachineLoad() as load:
            for _ in range(FLAGS.rounds):
                for name, kw in PATHS.items():
                    start = time.perf_counter()
                    decoding.generate(config, params, [prompt], max_new_tokens=n, **kw)
                    times[name].append((time.perf_counter() - start) * 1e3 / n)
    finally:
        if proc is not None:
            proc.kill()
            proc.wait()
    ratios = [x / f for f, x in zip(times["ffi"], times["xla"])]
    return {"times": times, "ratio": statistics.median(ratios), "other": load.other}


def main(argv):
    if len(argv) > 1:
        raise app.UsageError(f"unexpected arguments {argv[1:]}")
    if FLAGS.rounds < 2 or FLAGS.max_new_tokens < 1:
        raise app.UsageError("--rounds must be >= 2 and --max_new_tokens >= 1")
    config, params = checkpoints.load(FLAGS.checkpoint)
    prompt = cli.tokenizer_for(config, FLAGS.checkpoint).encode(cli.demo_texts()[0])
    for kw in PATHS.values():  # compile both programs before any timing
        decoding.generate(config, params, [prompt], max_new_tokens=FLAGS.max_new_tokens, **kw)
    print("competitor   path  ms/token median [IQR]      kernels / xla   other CPU")
    for competitor in FLAGS.competitors:
        r = measure(config, params, prompt, competitor)
        label = "none" if competitor == "none" else f"nice {competitor}"
        for name, values in r["times"].items():
            q1, med, q3 = quartiles(values)
            tail = f"{r['ratio']:10.2f}x   {r['other']:8.0%}" if name == "ffi" else ""
            print(f"{label:<12} {name:<5} {med:7.3f} [{q1:.3f}, {q3:.3f}]  {tail}")


if __name__ == "__main__":
    cli.run(main)
