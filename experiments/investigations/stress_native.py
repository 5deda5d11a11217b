"""Stress the native kernels next to fresh XLA compiles, looking for the suite's rare crash.

    python -m experiments.investigations.stress_native --iterations=200 [--linear=ffi|xla]

Each iteration decodes with MTP speculation at k = 1, 2, 3 on a tiny random model (the C++
linear, GDN and attention kernels when ``--linear=ffi``), clears JAX's caches, then compiles and
runs two steps of the MTP-only training step — the test in which a pytest worker twice died with a
segmentation fault (BUILD_NOTES.md, 2026-12-01). Prints the iteration count and elapsed seconds;
a crash shows as faulthandler's traceback. ``--linear=xla`` is the control without native code.
"""

from __future__ import annotations

import faulthandler
import time

import jax
import jax.numpy as jnp
import numpy as np
from absl import flags

from mtpspec import config as C
from mtpspec import decoding, models
from mtpspec.training import TrainConfig
from mtpspec.training.train import make_optimizer, make_train_step

FLAGS = flags.FLAGS
flags.DEFINE_integer("iterations", 200, "Decode + compile rounds.")
flags.DEFINE_enum("linear", "ffi", ["ffi", "xla"], "ffi: the native kernels; xla: the control.")


def main(argv):
    del argv
    faulthandler.enable()
    config = C.tiny_hybrid(vocab_size=256)
    params = models.init_params(config, jax.random.key(0))
    tc = TrainConfig(steps=10, batch=2, seq_len=16, phase="mtp_only", warmup=1)
    batch = jnp.asarray(np.random.default_rng(0).integers(0, 256, (2, 17)), jnp.int32)
    prompts = np.random.default_rng(1).integers(0, 256, (2, 7)).tolist()
    t0 = time.time()
    for it in range(FLAGS.iterations):
        for k in (1, 2, 3):
            native = FLAGS.linear == "ffi"
            spec = decoding.SpecConfig("mtp", k, verify_method="ffi" if native else "chunk")
            decoding.generate(
                config,
                params,
                prompts,
                max_new_tokens=24,
                speculative=spec,
                linear=FLAGS.linear,
                attention=FLAGS.linear,  # the control runs no native kernel at all
            )
        jax.clear_caches()
        opt = make_optimizer(tc)
        step = make_train_step(config, tc, opt)
        new, state, _ = step(params, opt.init(params), batch)
        new, _, _ = step(new, state, batch)
        jax.block_until_ready(new)
        print(f"{it + 1} iterations, {time.time() - t0:.1f} s", flush=True)


if __name__ == "__main__":
    from experiments import cli

    cli.run(main)
