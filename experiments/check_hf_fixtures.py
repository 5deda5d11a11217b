"""Print how closely mtpspec reproduces the HF transformers reference fixtures.

    python -m experiments.check_hf_fixtures

For each fixture checkpoint under tests/fixtures/hf: max |ours − HF| / max |HF| of the logits
(12 and 80 tokens), of the MTP head's logits, and whether cached greedy decoding reproduces HF's
generate() token for token. The fixtures come from tests/fixtures/make_hf_fixtures.py.
"""

from __future__ import annotations

import pathlib

import jax.numpy as jnp
import numpy as np
from absl import flags

from mtpspec import checkpoints, models

FLAGS = flags.FLAGS
flags.DEFINE_string(
    "fixtures",
    str(pathlib.Path(__file__).resolve().parent.parent / "tests" / "fixtures" / "hf"),
    "Directory of fixture checkpoints.",
)

DIRS = {
    "qwen3_next": "qwen3_next",
    "qwen3_next_bf16_sharded": "qwen3_next",
    "qwen3_5": "qwen3_5",
    "qwen3_5_vl_layout": "qwen3_5",
}


def rel(a, b) -> float:
    a, b = np.asarray(a, np.float64), np.asarray(b, np.float64)
    return float(np.max(np.abs(a - b)) / np.max(np.abs(b)))


def greedy(config, params, prompts, n):
    out = models.prefill(config, params, prompts, capacity=prompts.shape[1] + n)
    token = jnp.argmax(out.logits[:, -1], -1)
    got, state = [token], out.state
    for _ in range(n - 1):
        out = models.step(config, params, state, token)
        state, token = out.state, jnp.argmax(out.logits[:, -1], -1)
        got.append(token)
    return np.stack([np.asarray(t) for t in got], 1)


def main(argv):
    del argv
    root = pathlib.Path(FLAGS.fixtures)
    print(f"{'checkpoint':<26} {'logits':>10} {'logits80':>10} {'mtp':>10}  greedy==HF")
    for name, ref_dir in DIRS.items():
        config, params = checkpoints.load_hf(root / name, dtype="float32")
        ref = np.load(root / ref_dir / "reference.npz")
        ids = jnp.asarray(ref["input_ids"])
        logits, hidden = models.forward_hidden(config, params, ids)
        want = ref["logits_bf16_weights_f32"] if "bf16" in name else ref["logits"]
        row = [rel(logits, want)]
        if "bf16" in name:
            print(f"{name:<26} {row[0]:>10.2e} {'-':>10} {'-':>10}  -")
            continue
        row.append(
            rel(
                models.forward(config, params, jnp.asarray(ref["long_input_ids"])),
                ref["long_logits"],
            )
        )
        mtp_logits, _ = models.mtp_forward(config, params, hidden[:, :-1], ids[:, 1:])
        row.append(rel(mtp_logits, ref["mtp_logits"]))
        gen = ref["generated_ids"]
        same = bool(
            np.array_equal(
                greedy(config, params, jnp.asarray(ref["prompt_ids"]), gen.shape[1]), gen
            )
        )
        print(f"{name:<26} {row[0]:>10.2e} {row[1]:>10.2e} {row[2]:>10.2e}  {same}")


if __name__ == "__main__":
    from experiments import cli

    cli.run(main)
