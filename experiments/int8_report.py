"""What opt-in int8 weights cost in accuracy, against the checkpoint's own (stored) weights.

    python -m experiments.int8_report                               # the shipped model
    python -m experiments.int8_report --checkpoint=/tmp/q35 --num_draft=1,2,3

Loads the checkpoint twice for decoding (``checkpoints.load(..., for_decoding=True)`` and with
``weights="int8"``) and prints one JSON object:

  bytes                 the two DecodingWeights' bytes and their ratio
  kl                    KL(stored ‖ int8) of the next-token distributions, nats per position
                        (mean, median, p99), teacher-forced over the prompts, cut to the shortest
                        one's length (the held-out demo prompts for the byte vocabulary, else
                        ``cli.bench_prompts``' random ones)
  top1_agreement        share of positions where both predict the same next token
  tau                   per k: MTP acceptance (tokens per verify step) on the prompts, stored
                        and int8; ``int8_spec_equals_plain``: int8 speculative greedy emits int8
                        plain greedy's tokens (exactness holds within the int8 model)

Decode speed is ``bench_real_size --weights=int8``'s (beside the stored weights in turn).
"""

from __future__ import annotations

import json

import numpy as np
from absl import flags

from experiments import cli

FLAGS = flags.FLAGS
cli.define_checkpoint()
cli.define_num_draft("1,2,3")
cli.define_json_out()
flags.DEFINE_integer("new_tokens", 48, "Tokens per generate call for tau.")


def report(path, num_draft=(1, 2, 3), new_tokens: int = 48) -> dict:
    """The accuracy report for the checkpoint at ``path`` (see the module docstring)."""
    import jax
    import jax.numpy as jnp

    import mtpspec
    from mtpspec import checkpoints
    from mtpspec.models import state
    from mtpspec.models.decoder import window_step_impl
    from mtpspec.models.inference import compute_config

    config, stored = checkpoints.load(path, for_decoding=True)
    _, int8 = checkpoints.load(path, for_decoding=True, weights="int8")
    compute = compute_config(config, stored.linear)
    prompts = cli.bench_prompts(config, 4)

    @jax.jit
    def log_probs(tree, ids):
        b, n = ids.shape
        s = state.init_decode_state(compute, b, n)
        out = window_step_impl(compute, tree, s, ids, jnp.full((b,), n, jnp.int32), "chunk")
        return jax.nn.log_softmax(out.logits, axis=-1)

    n = min(len(p) for p in prompts)  # one batch (one compile per tree)
    ids = jnp.asarray([p[:n] for p in prompts], jnp.int32)
    a = np.asarray(log_probs(stored.tree, ids), np.float64).reshape(-1, config.vocab_size)
    b = np.asarray(log_probs(int8.tree, ids), np.float64).reshape(-1, config.vocab_size)
    kl = (np.exp(a) * (a - b)).sum(-1)
    agree = a.argmax(-1) == b.argmax(-1)
    short = [p[:64] for p in prompts]
    tau = {}
    if num_draft:
        plain8 = mtpspec.generate(config, int8, short, max_new_tokens=new_tokens).tokens
    for k in num_draft:
        spec = mtpspec.SpecConfig(num_draft=k)
        runs = {
            name: mtpspec.generate(config, w, short, max_new_tokens=new_tokens, speculative=spec)
            for name, w in (("stored", stored), ("int8", int8))
        }
        tau[str(k)] = {
            "stored": runs["stored"].stats["tau"],
            "int8": runs["int8"].stats["tau"],
            "int8_spec_equals_plain": runs["int8"].tokens == plain8,
        }
    return {
        "checkpoint": str(path),
        "bytes": {
            "stored": stored.nbytes,
            "int8": int8.nbytes,
            "ratio": int8.nbytes / stored.nbytes,
        },
        "positions": int(kl.size),
        "kl": {
            "mean": float(kl.mean()),
            "median": float(np.median(kl)),
            "p99": float(np.percentile(kl, 99)),
        },
        "top1_agreement": float(agree.mean()),
        "tau": tau,
    }


def main(argv):
    del argv
    out = report(FLAGS.checkpoint, cli.num_drafts(), FLAGS.new_tokens)
    print(json.dumps(out, indent=1))
    cli.write_json(out)


if __name__ == "__main__":
    cli.run(main)
