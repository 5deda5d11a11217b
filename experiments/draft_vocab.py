"""Choose a draft vocabulary (the N most frequent ids of some text) and measure what it costs τ.

    python -m experiments.draft_vocab --size=64 --out=/tmp/dv.json --measure     # shipped model
    python -m experiments.draft_vocab --checkpoint=DIR --text=a.txt,b.txt --size=32768

The ids are counted on ``--text`` files with the checkpoint's tokenizer; for the shipped model
without ``--text``, on its own training split (the corpus manifest's files that are not held
out). The result is written with ``DraftVocab.save`` (``--out``, default ``DIR/draft_vocab.json``
for a checkpoint directory that is not the shipped one) and used as
``SpecConfig(draft_vocab=DraftVocab.load(DIR))`` or ``--draft_vocab`` in the bench.

``--measure``: greedy decoding of the held-out demo prompts, plain and MTP k = 1..3 (or the
``--num_draft`` list) with and without the vocabulary: the coverage (share of plain greedy's
tokens inside it), τ each way, and whether every speculative run emitted plain greedy's tokens
(it must).
"""

from __future__ import annotations

import json
import pathlib

from absl import flags

from experiments import cli

FLAGS = flags.FLAGS
cli.define_checkpoint()
flags.DEFINE_list("text", None, "Text files to count ids on (default: the shipped corpus).")
flags.DEFINE_integer("size", None, "Ids to keep.", required=True)
flags.DEFINE_string("out", None, "Where to write draft_vocab.json (a directory or a .json).")
flags.DEFINE_bool("measure", False, "Measure coverage and τ on the held-out demo prompts.")
flags.DEFINE_integer("max_new_tokens", 128, "Tokens per prompt for --measure.")
cli.define_num_draft("1,2,3", "Draft lengths k for --measure (a comma list).")


def _texts(shipped: bool) -> tuple[list[str], str]:
    if FLAGS.text:
        return [pathlib.Path(p).read_text(errors="replace") for p in FLAGS.text], "--text files"
    if not shipped:
        raise ValueError("--text is needed for a checkpoint other than the shipped model")
    from mtpspec.training import data

    manifest = json.loads((cli.ASSETS / "corpus_manifest.json").read_text())
    root = data.stdlib_root()
    files = [e["path"] for e in manifest["files"] if not data.is_eval_file(e["path"], 0.1)]
    return [(root / f).read_text(errors="replace") for f in files], "the training split"


def measure(config, params, vocab, ks: list[int]) -> dict:
    import mtpspec

    prompts = cli.bench_prompts(config, 4)
    n = FLAGS.max_new_tokens
    plain = mtpspec.generate(config, params, prompts, max_new_tokens=n)
    out = {"coverage": vocab.coverage(plain.tokens), "runs": {}}
    for k in ks:
        for name, dv in (("full", None), (f"vocab={vocab.size}", vocab)):
            spec = mtpspec.SpecConfig(num_draft=k, draft_vocab=dv)
            r = mtpspec.generate(config, params, prompts, max_new_tokens=n, speculative=spec)
            out["runs"][f"mtp k={k} {name}"] = {
                "tau": r.stats["tau"],
                "same_as_plain": r.tokens == plain.tokens,
            }
    return out


def main(argv):
    del argv
    from mtpspec import checkpoints
    from mtpspec.decoding.draft_vocab import DraftVocab

    ks = cli.num_drafts()  # a bad --num_draft fails here, before the load
    path = pathlib.Path(FLAGS.checkpoint)
    shipped = path.resolve() == pathlib.Path(cli.DEFAULT_MODEL).resolve()
    if FLAGS.out is None and shipped:
        raise ValueError("--out is needed for the shipped model (its directory is not written)")
    config, params = checkpoints.load(path)
    tok = cli.tokenizer_for(config, path)
    texts, where = _texts(shipped)
    vocab = DraftVocab.from_tokens(
        (tok.encode(t) for t in texts),
        vocab_size=config.vocab_size,
        size=FLAGS.size,
        source=f"top {FLAGS.size} ids of {where} ({len(texts)} documents)",
    )
    written = vocab.save(FLAGS.out or path)
    result = {"draft_vocab": str(written), "size": vocab.size, "source": vocab.source}
    if FLAGS.measure:
        result.update(measure(config, params, vocab, ks))
    print(json.dumps(result, indent=1))


if __name__ == "__main__":
    cli.run(main)
