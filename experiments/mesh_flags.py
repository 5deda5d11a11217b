"""``--mesh`` and the multi-host flags shared by the experiment scripts (generate, train).

Single host, 8 devices, 2-way data x 4-way model parallel:

    python -m experiments.generate --mesh=2x4 --prompt="def fib(n):"

Multi-host (run the same command in every process; process 0's host:port is the coordinator):

    python -m experiments.train --workdir=/shared/run --mesh=2x8 \\
        --coordinator_address=10.0.0.1:1234 --num_processes=2 --process_id=$RANK

``--distributed`` alone lets JAX detect the cluster (SLURM, Open MPI, Cloud TPU).
"""

from __future__ import annotations

from absl import flags

from mtpspec import sharding

flags.DEFINE_string(
    "mesh", None, "Shard over a DATAxMODEL device mesh, e.g. 1x8 or 2x4 (default: one device)."
)
flags.DEFINE_enum(
    "mesh_axis_types", "auto", ["auto", "explicit"], "Mesh axis types (explicit runs as auto)."
)
flags.DEFINE_bool("distributed", False, "Multi-host: call jax.distributed.initialize().")
flags.DEFINE_string("coordinator_address", None, "Multi-host: host:port of process 0.")
flags.DEFINE_integer("num_processes", None, "Multi-host: number of processes.")
flags.DEFINE_integer("process_id", None, "Multi-host: this process's index.")

FLAGS = flags.FLAGS


def setup_mesh():
    """Start multi-host JAX when asked, then build the --mesh mesh (None without --mesh)."""
    explicit = (FLAGS.coordinator_address, FLAGS.num_processes, FLAGS.process_id)
    if FLAGS.distributed or any(v is not None for v in explicit):
        sharding.initialize_distributed(
            FLAGS.coordinator_address, FLAGS.num_processes, FLAGS.process_id
        )
    if FLAGS.mesh is None:
        return None
    data, model = sharding.parse_mesh(FLAGS.mesh)
    return sharding.make_mesh(data, model, axis_types=FLAGS.mesh_axis_types)
