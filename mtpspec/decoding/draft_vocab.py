"""A draft vocabulary: the token ids a proposer drafts among (FR-Spec; EAGLE-3's ``d2t``).

With a 248,320-token vocabulary the LM head is a third of a Qwen3.5-0.8B decode step, and the MTP
proposer runs it once per draft. Drafting among the N most frequent ids makes each draft's head
N rows. Verification stays over the full vocabulary, so nothing about the output changes:

* greedy: a draft is the argmax over the subset; the target accepts it only if it is the full
  argmax, so the emitted tokens are plain greedy's, token for token (a target token outside the
  subset is simply never drafted: it is emitted as the correction);
* sampling: the draft is drawn from the proposer's distribution renormalised over the subset
  (filters applied within it), and verification is handed that distribution on the full
  vocabulary (zero outside the subset): rejection sampling is lossless for any draft law.

    vocab = DraftVocab.from_tokens(token_lists, vocab_size=config.vocab_size, size=32768)
    vocab.save(checkpoint_dir)                       # draft_vocab.json beside config.json
    spec = SpecConfig(proposer="mtp", num_draft=2, draft_vocab=DraftVocab.load(checkpoint_dir))

``experiments/draft_vocab.py`` computes one from text files with a checkpoint's tokenizer.
"""

from __future__ import annotations

import hashlib
import json
import os
import pathlib
from collections.abc import Iterable

import numpy as np

FILE = "draft_vocab.json"


class DraftVocab:
    """Sorted, distinct token ids (int32, read-only), with a note of how they were chosen.

    Two vocabularies are equal (and hash alike) when they hold the same ids; ``source`` is
    provenance only. The size is part of the compiled program; the ids are an argument of it, so
    another vocabulary of the same size does not recompile."""

    __slots__ = ("_digest", "ids", "source", "vocab_size")

    def __init__(self, ids, *, vocab_size: int, source: str = ""):
        if isinstance(vocab_size, bool) or not isinstance(vocab_size, int) or vocab_size < 1:
            raise ValueError(f"vocab_size must be a positive int, got {vocab_size!r}")
        if not isinstance(source, str):
            raise TypeError(f"source must be a str, got {type(source).__name__}")
        a = np.asarray(ids)
        if a.ndim != 1 or a.size == 0:
            raise ValueError(f"draft vocabulary ids must be a non-empty 1-D list, got {a.shape}")
        if not np.issubdtype(a.dtype, np.integer):
            raise TypeError(f"draft vocabulary ids must be integers, got dtype {a.dtype}")
        if a.min() < 0 or a.max() >= vocab_size:
            raise ValueError(
                f"draft vocabulary ids must lie in [0, {vocab_size}); got {int(a.min())}.."
                f"{int(a.max())}"
            )
        a = np.sort(a.astype(np.int32))
        if np.any(a[1:] == a[:-1]):
            dup = int(a[1:][a[1:] == a[:-1]][0])
            raise ValueError(f"draft vocabulary ids must be distinct; {dup} appears twice")
        a.setflags(write=False)
        self.ids, self.vocab_size, self.source = a, vocab_size, source
        self._digest = hashlib.sha256(a.tobytes() + str(vocab_size).encode()).hexdigest()

    @property
    def size(self) -> int:
        return int(self.ids.size)

    def __eq__(self, other) -> bool:
        if not isinstance(other, DraftVocab):
            return NotImplemented
        return self._digest == other._digest

    def __hash__(self) -> int:
        return hash(self._digest)

    def __repr__(self) -> str:
        src = f", source={self.source!r}" if self.source else ""
        return f"DraftVocab(size={self.size}, vocab_size={self.vocab_size}{src})"

    # ---- making one ------------------------------------------------------------------------------

    @classmethod
    def from_counts(cls, counts, size: int, *, source: str = "") -> DraftVocab:
        """The ``size`` ids with the largest counts (ties: the lower id), from counts [V]."""
        c = np.asarray(counts)
        if c.ndim != 1 or not np.issubdtype(c.dtype, np.number):
            raise ValueError(f"counts must be a 1-D numeric array [vocab_size], got {c.shape}")
        if isinstance(size, bool) or not isinstance(size, int) or not 1 <= size <= c.size:
            raise ValueError(f"size must be an int in 1..{c.size} (the vocabulary), got {size!r}")
        order = np.lexsort((np.arange(c.size), -c.astype(np.float64)))
        return cls(order[:size], vocab_size=int(c.size), source=source)

    @classmethod
    def from_tokens(
        cls, sequences: Iterable, *, vocab_size: int, size: int, source: str = ""
    ) -> DraftVocab:
        """The ``size`` most frequent ids in token sequences (lists or arrays of ids)."""
        counts = token_counts(sequences, vocab_size)
        return cls.from_counts(counts, size, source=source)

    # ---- measuring it ----------------------------------------------------------------------------

    def coverage(self, tokens) -> float:
        """The share of ``tokens`` (any nesting of ids) that lie in the vocabulary."""
        t = np.concatenate([np.ravel(np.asarray(x)) for x in tokens]) if _nested(tokens) else tokens
        t = np.ravel(np.asarray(t))
        if t.size == 0:
            raise ValueError("coverage of no tokens is undefined")
        return float(np.isin(t, self.ids).mean())

    # ---- files -----------------------------------------------------------------------------------

    def save(self, path: str | os.PathLike) -> pathlib.Path:
        """Write ``draft_vocab.json`` into a directory (a checkpoint's), or to a ``.json`` path."""
        p = pathlib.Path(path)
        p = p if p.suffix == ".json" else p / FILE
        data = {"vocab_size": self.vocab_size, "source": self.source, "ids": self.ids.tolist()}
        tmp = p.with_name(p.name + ".tmp")
        tmp.write_text(json.dumps(data) + "\n")
        os.replace(tmp, p)
        return p

    @classmethod
    def load(cls, path: str | os.PathLike) -> DraftVocab:
        """Read what ``save`` wrote (a directory holding ``draft_vocab.json``, or the file)."""
        p = pathlib.Path(path)
        p = p / FILE if p.is_dir() else p
        try:
            data = json.loads(p.read_text())
        except FileNotFoundError as e:
            raise OSError(f"no draft vocabulary at {p}") from e
        except json.JSONDecodeError as e:
            raise ValueError(f"draft vocabulary {p} is not valid JSON: {e}") from e
        if not isinstance(data, dict) or not {"vocab_size", "ids"} <= data.keys():
            raise ValueError(f"draft vocabulary {p} needs 'vocab_size' and 'ids' entries")
        return cls(data["ids"], vocab_size=data["vocab_size"], source=data.get("source", ""))


def _nested(tokens) -> bool:
    return isinstance(tokens, list | tuple) and bool(tokens) and hasattr(tokens[0], "__len__")


def token_counts(sequences: Iterable, vocab_size: int) -> np.ndarray:
    """Occurrences of each id in token sequences, [vocab_size] int64 (ValueError for an id
    outside the vocabulary)."""
    counts = np.zeros(vocab_size, np.int64)
    for seq in sequences:
        a = np.ravel(np.asarray(seq, np.int64))
        bad = a[(a < 0) | (a >= vocab_size)]
        if bad.size:
            raise ValueError(f"token id {int(bad[0])} is outside the vocabulary of {vocab_size}")
        counts += np.bincount(a, minlength=vocab_size)
    return counts
