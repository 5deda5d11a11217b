"""Check an exported HF directory in transformers (needs the ``hf`` extra: torch + transformers).

    python -m experiments.export_hf --out=/tmp/default_hf
    python -m experiments.check_hf_export --checkpoint=/tmp/default_hf   # `make test-hf` checks it

Loads ``--checkpoint`` (an exported HF directory) with ``transformers.AutoModelForCausalLM``
(float32, eager attention, the pure-torch GDN path) and compares with mtpspec on ``--source``
(the checkpoint it was exported from; default: the shipped default model):
  * logits of a stdlib text snippet and of random token ids: max |ours − HF| / max |HF| and
    argmax agreement;
  * greedy continuations: transformers ``generate`` (with its cache) vs ``mtpspec.generate``;
  * when the directory has a tokenizer: ``AutoTokenizer`` encodes the texts to the same ids as
    ``ByteTokenizer`` (vocabulary 256) and decodes the ids (also random byte strings, invalid
    UTF-8 included) to the same text.
"""

from __future__ import annotations

import json
import pathlib

import numpy as np
from absl import app, flags

from experiments import cli

FLAGS = flags.FLAGS
cli.define_checkpoint("The exported HF directory to check (experiments.export_hf --out).", None)
flags.DEFINE_string("source", str(cli.DEFAULT_MODEL), "The checkpoint it was exported from.")
flags.DEFINE_integer("length", 128, "Tokens per compared sequence.")
flags.DEFINE_integer("greedy_tokens", 32, "Greedy tokens compared with transformers generate.")
cli.define_json_out()

TEXTS = ("", "def main():\n    return 0\n", "  héllo, 世界 🎉\t\r\n", "\x00\x7f\x80 ÿ")


def sample_tokens(vocab_size: int, length: int) -> np.ndarray:
    """[2, length] int32: a stdlib source snippet as bytes (when the vocabulary is bytes) and
    seeded random ids."""
    rng = np.random.default_rng(0)
    rand = rng.integers(0, vocab_size, size=length)
    if vocab_size == 256:
        from mtpspec.training.data import stdlib_root

        text = (stdlib_root() / "textwrap.py").read_bytes()[:length]
        first = np.frombuffer(text.ljust(length, b" "), np.uint8).astype(np.int64)
    else:
        first = rng.integers(0, vocab_size, size=length)
    return np.stack([first, rand]).astype(np.int32)


def rel(a, b) -> float:
    a, b = np.asarray(a, np.float64), np.asarray(b, np.float64)
    return float(np.max(np.abs(a - b)) / np.max(np.abs(b)))


def check_tokenizer(hf_dir: pathlib.Path) -> dict | None:
    """AutoTokenizer vs ByteTokenizer on TEXTS and on random byte strings."""
    if not (hf_dir / "tokenizer.json").is_file():
        return None
    from transformers import AutoTokenizer

    from mtpspec.tokenizers import ByteTokenizer, HFTokenizer, byte_tokenizer_json

    if json.loads((hf_dir / "tokenizer.json").read_text()) != byte_tokenizer_json():
        return {"tokenizer_class": "not the byte tokenizer (not compared)"}

    tok, ours = AutoTokenizer.from_pretrained(hf_dir), ByteTokenizer()
    encode_ok = all(tok(t, add_special_tokens=True)["input_ids"] == ours.encode(t) for t in TEXTS)
    rng = np.random.default_rng(1)
    samples = [list(ours.encode(t)) for t in TEXTS]
    samples += [rng.integers(0, 256, size=rng.integers(0, 16)).tolist() for _ in range(500)]
    decode_ok = all(tok.decode(ids) == ours.decode(ids) for ids in samples)
    mine = HFTokenizer(hf_dir)  # mtpspec's own tokenizers-backed reader of the same file
    mine_ok = all(mine.encode(t) == ours.encode(t) for t in TEXTS) and all(
        mine.decode(ids) == ours.decode(ids) for ids in samples
    )
    return {
        "tokenizer_class": type(tok).__name__,
        "vocab": len(tok),
        "encode_equal": encode_ok,
        "decode_equal": decode_ok,
        "decode_samples": len(samples),
        "hftokenizer_equal": mine_ok,
    }


def compare(hf_dir, config, params, *, length: int = 128, greedy_tokens: int = 32) -> dict:
    """Everything the module docstring lists for the export in ``hf_dir`` of ``(config,
    params)`` (mtpspec computes in float32), as a dict of numbers and booleans."""
    import dataclasses

    import jax
    import jax.numpy as jnp
    import torch
    from transformers import AutoModelForCausalLM

    import mtpspec
    from mtpspec import models

    hf_dir = pathlib.Path(hf_dir)
    config = dataclasses.replace(config, dtype="float32")
    params = jax.tree.map(lambda x: x.astype(jnp.float32), params)
    model, info = AutoModelForCausalLM.from_pretrained(
        hf_dir, dtype=torch.float32, attn_implementation="eager", output_loading_info=True
    )
    model.eval()
    ids = sample_tokens(config.vocab_size, length)
    with torch.no_grad():
        theirs = model(torch.as_tensor(ids, dtype=torch.long)).logits.numpy()
    ours = np.asarray(models.forward(config, params, jnp.asarray(ids)))
    prompts = [ids[0, :16].tolist(), ids[1, :16].tolist()]
    with torch.no_grad():
        hf_out = model.generate(
            torch.as_tensor(prompts, dtype=torch.long),
            max_new_tokens=greedy_tokens,
            min_new_tokens=greedy_tokens,
            do_sample=False,
            eos_token_id=None,
            pad_token_id=0,
        )
    hf_greedy = hf_out[:, 16:].tolist()
    our_greedy = mtpspec.generate(config, params, prompts, max_new_tokens=greedy_tokens).tokens
    return {
        "hf_class": type(model).__name__,
        "hf_loading_problems": {k: sorted(v) for k, v in info.items() if v},
        "logits_rel_err": rel(ours, theirs),
        "logits_rel_err_per_row": [rel(ours[i], theirs[i]) for i in range(len(ids))],
        "argmax_agreement": float(np.mean(ours.argmax(-1) == theirs.argmax(-1))),
        "greedy_equal": hf_greedy == our_greedy,
        "greedy_tokens": greedy_tokens,
        "tokenizer": check_tokenizer(hf_dir),
    }


def main(argv):
    del argv
    if not FLAGS.checkpoint:
        raise app.UsageError("--checkpoint (the exported HF directory) is required")
    from mtpspec import checkpoints

    config, params = checkpoints.load(FLAGS.source)
    r = compare(
        FLAGS.checkpoint, config, params, length=FLAGS.length, greedy_tokens=FLAGS.greedy_tokens
    )
    print(f"transformers class         {r['hf_class']}")
    print(f"missing/unexpected weights {r['hf_loading_problems'] or 'none'}")
    print(
        f"logits max|ours-HF|/max|HF| {r['logits_rel_err']:.2e} (text, random: "
        f"{', '.join(f'{x:.2e}' for x in r['logits_rel_err_per_row'])})"
    )
    print(f"argmax agreement           {r['argmax_agreement']:.4f}")
    print(f"greedy {r['greedy_tokens']} tokens == HF generate: {r['greedy_equal']}")
    t = r["tokenizer"]
    if t is None:
        print("tokenizer                  none in the directory")
    elif "vocab" not in t:
        print(f"tokenizer                  {t['tokenizer_class']}")
    else:
        print(
            f"tokenizer ({t['tokenizer_class']}, {t['vocab']} ids): encode == ByteTokenizer "
            f"{t['encode_equal']}, decode == ByteTokenizer {t['decode_equal']} "
            f"({t['decode_samples']} id lists); mtpspec HFTokenizer too: {t['hftokenizer_equal']}"
        )
    cli.write_json(r)


if __name__ == "__main__":
    cli.run(main)
