"""What the sharding rules do to one model on one mesh: the placement of every parameter kind
and the collectives XLA inserted into the compiled generate programs.

    python -m experiments.sharding_report --mesh=1x2 --simulate_devices=8   # (the default mesh)
    python -m experiments.sharding_report --checkpoint=DIR --mesh=2x4

``--simulate_devices=N`` runs on N simulated CPU devices (sets XLA_FLAGS before JAX starts).
Collective counts are static (ops in the program text: prefill + one loop body), not per step.
"""

from __future__ import annotations

import os
import sys

if __name__ == "__main__":  # must happen before JAX initialises its backend
    for arg in sys.argv[1:]:
        if arg.startswith("--simulate_devices="):
            n = int(arg.split("=", 1)[1])
            os.environ["XLA_FLAGS"] = (
                os.environ.get("XLA_FLAGS", "") + f" --xla_force_host_platform_device_count={n}"
            ).strip()

import collections  # noqa: E402
import dataclasses  # noqa: E402
import re  # noqa: E402

import jax  # noqa: E402
from absl import flags  # noqa: E402

from experiments import cli  # noqa: E402
from mtpspec import checkpoints, decoding, sharding  # noqa: E402
from mtpspec.models import init_params  # noqa: E402

FLAGS = flags.FLAGS
cli.define_checkpoint()
cli.define_speculation()
cli.define_mesh()
flags.DEFINE_integer("simulate_devices", None, "Simulated CPU devices (read before JAX starts).")
flags.DEFINE_list(
    "override", None, "Diagnostic: config fields NAME=INT (random weights of that shape)."
)

COLLECTIVES = ("all-reduce", "all-gather", "all-to-all", "collective-permute", "reduce-scatter")
_OP = re.compile(r"\b(" + "|".join(COLLECTIVES) + r")(?:-start)?\(")


def main(argv):
    del argv
    d, m = sharding.parse_mesh(FLAGS.mesh or "1x2")
    mesh = sharding.make_mesh(d, m, devices=jax.devices()[: d * m])
    config, params = checkpoints.load(FLAGS.checkpoint)
    if FLAGS.override:
        fields = {k: int(v) for k, v in (item.split("=", 1) for item in FLAGS.override)}
        config = dataclasses.replace(config, **fields)
        params = init_params(config, jax.random.key(0))
    params = sharding.shard_params(config, params, mesh)
    print(f"model {FLAGS.checkpoint}: {config.num_layers} layers, mesh {FLAGS.mesh}")
    seen = {}
    for row in sharding.describe(config, mesh):
        kind = re.sub(r"\[\d+\]", "[i]", row["path"])
        seen.setdefault(kind, row)
    for kind, row in seen.items():
        flag = "  (replicated: count does not divide)" if row["replicated_on_model"] else ""
        print(f"  {kind:<42} {str(row['shape']):<16} {str(row['spec']):<22}{flag}")
    k = cli.one(cli.num_drafts(), "num_draft")
    proposer = cli.one(cli.proposers(), "proposer")
    spec = decoding.SpecConfig(proposer, k, cli.one(cli.commits(), "commit"))
    for name, sp in (("plain", None), (f"{proposer} k={k}", spec)):
        prepared = decoding.prepare(
            config, params, [[1, 2, 3]], max_new_tokens=16, speculative=sp, mesh=mesh
        )
        text = prepared.lower().compile().as_text()
        counts = collections.Counter(_OP.findall(text))
        print(f"collectives in the {name} program: " + ", ".join(
            f"{counts.get(c, 0)} {c}" for c in COLLECTIVES))  # fmt: skip


if __name__ == "__main__":
    cli.run(main)
