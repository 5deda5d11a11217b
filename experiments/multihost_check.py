"""Multi-host on one machine: the experiment scripts in 2 processes x 4 CPU devices each, joined
by ``jax.distributed`` (``--coordinator_address/--num_processes/--process_id``) into one 2x4 mesh,
against the same script in one process on one device.

    python -m experiments.multihost_check

Runs ``experiments.generate`` (MTP speculative, k = 2, on the default model) and
``experiments.train`` (tiny preset, 3 steps) both ways and compares tokens and per-step losses.
CPU processes exchange collectives through gloo (``JAX_CPU_COLLECTIVES_IMPLEMENTATION=gloo``);
on GPU hosts NCCL is used and only the three flags (or ``--distributed`` under SLURM) are needed.
"""

from __future__ import annotations

import json
import os
import pathlib
import socket
import subprocess
import sys
import tempfile

import numpy as np
from absl import flags

FLAGS = flags.FLAGS
flags.DEFINE_integer("max_new_tokens", 32, "Tokens to generate.")
flags.DEFINE_integer("train_steps", 3, "Training steps.")
flags.DEFINE_integer("timeout", 600, "Seconds per launch.")

PROMPT = "72,101,108,108,111,44,32,119,111,114,108,100,33,10,100,101,102,32,102"


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _launch(args: list[list[str]], devices: int) -> None:
    env = dict(os.environ)
    env["XLA_FLAGS"] = f"--xla_force_host_platform_device_count={devices}"
    env["JAX_CPU_COLLECTIVES_IMPLEMENTATION"] = "gloo"
    env["JAX_PLATFORMS"] = "cpu"
    procs = [
        subprocess.Popen([sys.executable, "-m", *a], env=env, stdout=subprocess.PIPE,
                         stderr=subprocess.STDOUT, text=True)
        for a in args
    ]  # fmt: skip
    for p, a in zip(procs, args, strict=True):
        out, _ = p.communicate(timeout=FLAGS.timeout)
        if p.returncode:
            raise RuntimeError(f"{' '.join(a)} failed ({p.returncode}):\n{out[-3000:]}")


def _multi(script: list[str], n: int = 2) -> list[list[str]]:
    port = _free_port()
    return [
        script + ["--mesh=2x4", f"--coordinator_address=127.0.0.1:{port}",
                  f"--num_processes={n}", f"--process_id={i}"]
        for i in range(n)
    ]  # fmt: skip


def main(argv):
    del argv
    tmp = pathlib.Path(tempfile.mkdtemp(prefix="mtpspec_multihost_"))
    gen = ["experiments.generate", f"--prompt_ids={PROMPT}", "--proposer=mtp", "--num_draft=2",
           "--commit=states", f"--max_new_tokens={FLAGS.max_new_tokens}"]  # fmt: skip
    _launch([gen + [f"--json_out={tmp / 'one.json'}"]], devices=1)
    args = _multi(gen)
    _launch([a + [f"--json_out={tmp / f'p{i}.json'}"] for i, a in enumerate(args)], devices=4)
    one = json.loads((tmp / "one.json").read_text())[0]["tokens"]
    per = [json.loads((tmp / f"p{i}.json").read_text())[0]["tokens"] for i in range(2)]
    print(f"generate, 2 processes x 4 devices (mesh 2x4) vs 1 device: {len(one)} tokens, "
          f"process 0 equal {per[0] == one}, process 1 equal {per[1] == one}")  # fmt: skip

    train = ["experiments.train", "--preset=tiny", f"--steps={FLAGS.train_steps}", "--batch=4",
             "--seq_len=32", "--save_every=1", "--eval_every=100", "--log_every=1"]  # fmt: skip
    _launch([train + [f"--workdir={tmp / 'train_one'}"]], devices=1)
    _launch(_multi(train + [f"--workdir={tmp / 'train_multi'}"]), devices=4)

    def losses(run):
        rows = (tmp / run / "metrics.jsonl").read_text().splitlines()
        return np.array([json.loads(r)["loss"] for r in rows])

    a, b = losses("train_one"), losses("train_multi")
    rel = float(np.max(np.abs(a - b) / np.abs(a))) if len(a) == len(b) else float("inf")
    print(f"train, {len(a)} steps: losses {np.round(a, 6).tolist()} (1 device) vs "
          f"{np.round(b, 6).tolist()} (2x4 over 2 processes), max rel diff {rel:.2e}")  # fmt: skip
    ok = per[0] == one and per[1] == one and rel < 1e-5
    print("OK" if ok else "MISMATCH")
    if not ok:
        raise SystemExit(1)


if __name__ == "__main__":
    from experiments import cli

    cli.run(main)
