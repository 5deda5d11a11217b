"""What opt-in int8 weights cost in accuracy, against the checkpoint's own (stored) weights.

    python -m experiments.int8_report                               # the shipped model
    python -m experiments.int8_report --checkpoint=/tmp/q35 --num_draft=1,2,3

Loads the checkpoint twice for decoding (``checkpoints.load(..., for_decoding=True)`` and with
``weights="int8"``) and prints one JSON object (``mtpspec.analysis.quantization.weights_report``):

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

from absl import flags

from experiments import cli

FLAGS = flags.FLAGS
cli.define_checkpoint()
cli.define_num_draft("1,2,3")
cli.define_json_out()
flags.DEFINE_integer("new_tokens", 48, "Tokens per generate call for tau.")


def main(argv):
    del argv
    from mtpspec.analysis.quantization import weights_report

    ks = cli.num_drafts()  # a bad --num_draft fails before any load

    def prompts(config):  # the held-out demo prompts for the byte vocabulary, else random ones
        return cli.bench_prompts(config, 4)

    out = weights_report(FLAGS.checkpoint, prompts, ks, FLAGS.new_tokens)
    print(json.dumps(out, indent=1))
    cli.write_json(out)


if __name__ == "__main__":
    cli.run(main)
