"""Offline text data: the Python standard library's own source, selected by a hashed manifest.

Every machine with this Python has the corpus, so nothing is downloaded. ``build_manifest`` picks
files and records their sha256; ``load_corpus`` reads exactly those files, refuses any whose hash
differs (reproducibility), and splits train / held-out by file (a hash of the path). Batches are a
pure function of (seed, step), so a resumed run sees the same data order.

Tokenizers: ``ByteTokenizer`` (default, vocabulary 256) and ``HFTokenizer`` (a ``tokenizer.json``
via the optional ``tokenizers`` package, for real checkpoints).
"""

from __future__ import annotations

import hashlib
import json
import os
import pathlib
import sysconfig
from typing import NamedTuple

import numpy as np


class ByteTokenizer:
    """UTF-8 bytes as token ids 0..255."""

    vocab_size = 256

    def encode(self, text: str) -> list[int]:
        return list(text.encode("utf-8"))

    def decode(self, ids) -> str:
        return bytes(int(i) for i in ids).decode("utf-8", errors="replace")


def _bytes_to_unicode() -> dict[int, str]:
    """GPT-2's byte -> printable character map, which the ``tokenizers`` ByteLevel pre-tokenizer
    and decoder use: printable Latin-1 bytes map to themselves, the other 68 bytes to U+0100.."""
    printable = [*range(ord("!"), ord("~") + 1), *range(0xA1, 0xAC + 1), *range(0xAE, 0xFF + 1)]
    extra = [b for b in range(256) if b not in printable]
    chars = [*printable, *range(256, 256 + len(extra))]
    return dict(zip([*printable, *extra], map(chr, chars), strict=True))


def byte_tokenizer_json() -> dict:
    """``ByteTokenizer`` as a Hugging Face ``tokenizers`` ``tokenizer.json`` (written directly,
    no ``tokenizers`` dependency): a byte-level BPE with no merges whose vocabulary maps the
    ByteLevel character of byte b to id b, so encode = the UTF-8 bytes and decode = the bytes
    decoded with replacement of invalid sequences, exactly as ``ByteTokenizer``. No special
    tokens (ids 0..255 are all bytes; there is no eos/bos/pad), no normaliser, no regex split,
    no prefix space, no post-processor (nothing is added around a sequence)."""
    byte_level = {
        "type": "ByteLevel",
        "add_prefix_space": False,
        "trim_offsets": False,
        "use_regex": False,
    }
    chars = _bytes_to_unicode()
    return {
        "version": "1.0",
        "truncation": None,
        "padding": None,
        "added_tokens": [],
        "normalizer": None,
        "pre_tokenizer": byte_level,
        "post_processor": None,
        "decoder": byte_level,
        "model": {
            "type": "BPE",
            "dropout": None,
            "unk_token": None,
            "continuing_subword_prefix": None,
            "end_of_word_suffix": None,
            "fuse_unk": False,
            "byte_fallback": False,
            "ignore_merges": False,
            "vocab": {chars[b]: b for b in range(ByteTokenizer.vocab_size)},
            "merges": [],
        },
    }


class HFTokenizer:
    """A Hugging Face ``tokenizer.json`` (needs the ``tokenizers`` package)."""

    def __init__(self, path: str | os.PathLike):
        try:
            from tokenizers import Tokenizer
        except ImportError as e:  # pragma: no cover - depends on the optional package
            raise ImportError(
                "HFTokenizer needs the 'tokenizers' package: pip install tokenizers"
            ) from e
        path = pathlib.Path(path)
        if path.is_dir():
            path = path / "tokenizer.json"
        if not path.is_file():
            raise OSError(f"no tokenizer.json at {path}")
        self._tok = Tokenizer.from_file(str(path))
        self.vocab_size = self._tok.get_vocab_size()

    def encode(self, text: str) -> list[int]:
        return self._tok.encode(text).ids

    def decode(self, ids) -> str:
        return self._tok.decode([int(i) for i in ids])

    def to_json(self) -> str:
        """The ``tokenizer.json`` text (for ``checkpoints.save_hf``)."""
        return self._tok.to_str(pretty=True)


def stdlib_root() -> pathlib.Path:
    return pathlib.Path(sysconfig.get_paths()["stdlib"])


def _sha256(path: pathlib.Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def build_manifest(max_bytes: int, *, root: pathlib.Path | None = None, max_file_bytes=60_000):
    """Pick .py files of the stdlib (sorted paths, no tests, no site-packages) up to ``max_bytes``.
    Returns {"root_hint", "files": [{"path", "sha256", "bytes"}]} (paths relative to root)."""
    root = root or stdlib_root()
    files, total = [], 0
    for path in sorted(root.rglob("*.py")):
        rel = path.relative_to(root).as_posix()
        if any(
            part in rel for part in ("site-packages", "test", "idlelib", "lib2to3", "__pycache__")
        ):
            continue
        size = path.stat().st_size
        if size < 2_000 or size > max_file_bytes:
            continue
        files.append({"path": rel, "sha256": _sha256(path), "bytes": size})
        total += size
        if total >= max_bytes:
            break
    return {"root_hint": str(root), "files": files}


def is_eval_file(rel_path: str, eval_fraction: float) -> bool:
    """Deterministic held-out assignment by a hash of the path."""
    h = int(hashlib.sha256(rel_path.encode()).hexdigest()[:8], 16)
    return h / 0xFFFFFFFF < eval_fraction


class Corpus(NamedTuple):
    train: np.ndarray  # uint8 bytes of the training files, concatenated
    eval: np.ndarray  # uint8 bytes of the held-out files
    eval_files: list[str]


def load_corpus(
    manifest: dict | str | os.PathLike,
    *,
    eval_fraction: float = 0.1,
    root: pathlib.Path | None = None,
) -> Corpus:
    """Read the manifest's files, verifying every hash; split by file into train / held-out."""
    if not isinstance(manifest, dict):
        with open(manifest) as f:
            manifest = json.load(f)
    root = root or stdlib_root()
    train, held, held_names = [], [], []
    for entry in manifest["files"]:
        path = root / entry["path"]
        if not path.is_file():
            raise OSError(f"corpus file missing: {path} (manifest built on another Python?)")
        data = path.read_bytes()
        if hashlib.sha256(data).hexdigest() != entry["sha256"]:
            raise ValueError(f"corpus file {path} does not match its manifest hash")
        chunk = np.frombuffer(data + b"\n\n", np.uint8)
        if is_eval_file(entry["path"], eval_fraction):
            held.append(chunk)
            held_names.append(entry["path"])
        else:
            train.append(chunk)
    if not train or not held:
        raise ValueError("the manifest gives an empty train or held-out split")
    return Corpus(np.concatenate(train), np.concatenate(held), held_names)


def batch_at(data: np.ndarray, step: int, *, batch: int, seq_len: int, seed: int) -> np.ndarray:
    """Training batch for ``step``: [batch, seq_len + 1] int32 windows at positions drawn from
    a generator seeded by (seed, step) — the data order is a function of the step alone."""
    rng = np.random.default_rng([seed, step])
    starts = rng.integers(0, len(data) - seq_len - 1, size=batch)
    return np.stack([data[s : s + seq_len + 1] for s in starts]).astype(np.int32)


def eval_batches(data: np.ndarray, *, batch: int, seq_len: int, count: int) -> list[np.ndarray]:
    """Fixed, evenly spaced held-out windows."""
    span = len(data) - seq_len - 1
    starts = np.linspace(0, span, batch * count).astype(np.int64)
    windows = np.stack([data[s : s + seq_len + 1] for s in starts]).astype(np.int32)
    return [windows[i * batch : (i + 1) * batch] for i in range(count)]
