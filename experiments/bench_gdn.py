"""Time every gated-delta-rule method against the recurrence, in one run.

    python -m experiments.bench_gdn        # realistic heads: 16 key, 32 value, dims 128
    python -m experiments.bench_gdn --lengths=1,8,64 --json_out=/tmp/gdn.json

Each method is a jitted function of its inputs; compilation and one warm-up call are excluded; the
figure is the median of --repeats timed calls. Ratios are speed-ups over "recurrent" measured in the
same process (these machines are shared and noisy: absolute times are not comparable across runs).
"""

from __future__ import annotations

import statistics
import time

import jax
import jax.numpy as jnp
from absl import flags

from experiments import cli
from mtpspec import ops

FLAGS = flags.FLAGS
flags.DEFINE_list("lengths", ["1", "2", "4", "8", "16", "64", "512", "2048"], "Sequence lengths.")
flags.DEFINE_list("methods", ["recurrent", "chunk", "assoc"], "Methods; the first is the baseline.")
flags.DEFINE_integer("batch", 1, "Batch size.")
flags.DEFINE_integer("key_heads", 16, "q/k heads.")
flags.DEFINE_integer("value_heads", 32, "v heads (a multiple of key_heads).")
flags.DEFINE_integer("key_dim", 128, "Key head dim.")
flags.DEFINE_integer("value_dim", 128, "Value head dim.")
flags.DEFINE_integer(
    "chunk_size", None, "Chunk size for the chunked form (None: platform default)."
)
flags.DEFINE_integer("assoc_max_t", 64, "Skip 'assoc' above this length (it stores t·h·k² floats).")
flags.DEFINE_integer("repeats", 5, "Timed calls per point (median reported).")
cli.define_json_out()


def make_inputs(t: int, seed: int = 0):
    keys = jax.random.split(jax.random.key(seed), 6)
    b, hk, hv = FLAGS.batch, FLAGS.key_heads, FLAGS.value_heads
    dk, dv = FLAGS.key_dim, FLAGS.value_dim
    q = ops.l2_norm(jax.random.normal(keys[0], (b, t, hk, dk)))
    k = ops.l2_norm(jax.random.normal(keys[1], (b, t, hk, dk)))
    v = jax.random.normal(keys[2], (b, t, hv, dv))
    g = -jax.nn.softplus(jax.random.normal(keys[3], (b, t, hv)))
    beta = jax.nn.sigmoid(jax.random.normal(keys[4], (b, t, hv)))
    s0 = 0.1 * jax.random.normal(keys[5], (b, hv, dk, dv))
    return q, k, v, g, beta, s0


def time_method(method: str, inputs) -> float:
    """Median seconds per call of the jitted method (compile + warm-up excluded)."""

    @jax.jit
    def fn(q, k, v, g, beta, s0):
        return ops.gated_delta_rule(
            q, k, v, g, beta, initial_state=s0, method=method, chunk_size=FLAGS.chunk_size
        )

    jax.block_until_ready(fn(*inputs))  # compile
    jax.block_until_ready(fn(*inputs))  # warm-up
    times = []
    for _ in range(FLAGS.repeats):
        start = time.perf_counter()
        jax.block_until_ready(fn(*inputs))
        times.append(time.perf_counter() - start)
    return statistics.median(times)


def main(argv):
    del argv
    lengths = [int(x) for x in FLAGS.lengths]
    methods = list(FLAGS.methods)
    base = methods[0]
    print(
        f"gated_delta_rule on {jax.default_backend()} ({jax.devices()[0].device_kind}), "
        f"b={FLAGS.batch} hk={FLAGS.key_heads} hv={FLAGS.value_heads} "
        f"k={FLAGS.key_dim} v={FLAGS.value_dim} chunk={FLAGS.chunk_size}, jax {jax.__version__}"
    )
    header = f"{'T':>6} " + " ".join(f"{m + ' ms':>14}" for m in methods)
    header += " " + " ".join(f"{m + ' x':>10}" for m in methods[1:])
    print(header)
    rows = []
    for t in lengths:
        inputs = make_inputs(t)
        row = {"t": t}
        for m in methods:
            skip = m == "assoc" and t > FLAGS.assoc_max_t
            row[m] = None if skip else time_method(m, inputs)
        rows.append(row)
        cells = [
            f"{'skipped':>14}" if row[m] is None else f"{row[m] * 1e3:>14.3f}" for m in methods
        ]
        ratios = [
            f"{'-':>10}" if row[m] is None else f"{row[base] / row[m]:>10.2f}" for m in methods[1:]
        ]
        print(f"{t:>6} " + " ".join(cells) + " " + " ".join(ratios), flush=True)
    print(f"(x = speed-up over '{base}' measured in this run; higher is faster)")
    meta = {
        k: getattr(FLAGS, k)
        for k in ("batch", "key_heads", "value_heads", "key_dim", "value_dim", "chunk_size")
    }
    cli.write_json({"backend": jax.default_backend(), "jax": jax.__version__, **meta, "rows": rows})


if __name__ == "__main__":
    jnp.zeros(())  # initialise the backend before absl parses flags (keeps logs tidy)
    cli.run(main)
