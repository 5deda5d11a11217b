"""Offline text data: the Python standard library's own source, selected by a hashed manifest.

Every machine with this Python has the corpus, so nothing is downloaded. ``build_manifest`` picks
files and records their sha256; ``load_corpus`` reads exactly those files, refuses any whose hash
differs (reproducibility), and splits train / held-out by file (a hash of the path). Batches are a
pure function of (seed, step), so a resumed run sees the same data order.

Tokenizers live in ``mtpspec.tokenizers``.
"""

from __future__ import annotations

import hashlib
import json
import os
import pathlib
import sysconfig
from typing import NamedTuple

import numpy as np


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


# ---- your own text: a file, a directory of files, or JSONL -----------------------------------

PIECE_CHARS = 64_000  # a single text file is split into documents of about this many characters


def _documents(path: pathlib.Path) -> list[tuple[str, str]]:
    """(key, text) documents: JSONL lines' "text", a directory's text files (recursive, sorted,
    hidden and non-UTF-8 files skipped), or one text file cut at line ends into pieces."""
    if path.is_dir():
        docs = []
        for f in sorted(path.rglob("*")):
            rel = f.relative_to(path).as_posix()
            if not f.is_file() or any(part.startswith(".") for part in f.relative_to(path).parts):
                continue
            try:
                text = f.read_text(encoding="utf-8")
            except UnicodeDecodeError:
                continue  # binary
            docs.extend(_documents_of_file(rel, f, text))
        return docs
    if not path.is_file():
        raise OSError(f"no training data at {path} (a text file, a directory or a .jsonl file)")
    try:
        text = path.read_text(encoding="utf-8")
    except UnicodeDecodeError as e:
        raise ValueError(f"{path} is not UTF-8 text: {e}") from e
    return _documents_of_file(path.name, path, text)


def _documents_of_file(key: str, path: pathlib.Path, text: str) -> list[tuple[str, str]]:
    if path.suffix == ".jsonl":
        docs = []
        for i, line in enumerate(text.splitlines()):
            if not line.strip():
                continue
            try:
                row = json.loads(line)
            except json.JSONDecodeError as e:
                raise ValueError(f"{path} line {i + 1} is not JSON: {e}") from e
            if not isinstance(row, dict) or not isinstance(row.get("text"), str):
                raise ValueError(f"{path} line {i + 1} has no string field 'text'")
            docs.append((f"{key}:{i}", row["text"]))
        return docs
    if len(text) <= PIECE_CHARS:
        return [(key, text)]
    pieces, start = [], 0
    while start < len(text):
        end = text.find("\n", start + PIECE_CHARS)
        end = len(text) if end < 0 else end + 1
        pieces.append((f"{key}#{len(pieces)}", text[start:end]))
        start = end
    return pieces


def load_text(
    path: str | os.PathLike,
    tokenizer,
    *,
    eval_fraction: float = 0.1,
    min_tokens: int = 2,
) -> Corpus:
    """Tokenized training data from ``path``: a text file, a directory of text files, or a JSONL
    file with a ``text`` field per line. Documents (files; JSONL lines; ~64k-character pieces of
    one big file) go to train or held-out by a hash of their name (``is_eval_file``) and are
    joined with the tokenizer's first EOS id between them (or a blank line for a tokenizer with
    no EOS, e.g. bytes). Returns ``Corpus`` with int32 token arrays; ValueError when a split is
    shorter than ``min_tokens``."""
    path = pathlib.Path(path)
    docs = [(k, t) for k, t in _documents(path) if t.strip()]
    if not docs:
        raise ValueError(f"no text found in {path}")
    eos = list(getattr(tokenizer, "eos_token_ids", ()) or ())
    sep = eos[:1] if eos else tokenizer.encode("\n\n")
    train, held, held_names = [], [], []
    for key, text in docs:
        ids = [*tokenizer.encode(text), *sep]
        if is_eval_file(key, eval_fraction):
            held.extend(ids)
            held_names.append(key)
        else:
            train.extend(ids)
    if len(docs) > 1 and not held:  # few documents: hold the last one out
        key, text = docs[-1]
        held = [*tokenizer.encode(text), *sep]
        held_names = [key]
        train = [i for k, t in docs[:-1] for i in (*tokenizer.encode(t), *sep)]
    if len(train) < min_tokens or len(held) < min_tokens:
        raise ValueError(
            f"{path}: {len(train)} training and {len(held)} held-out tokens; need at least "
            f"{min_tokens} of each (give more text, or one more document)"
        )
    return Corpus(np.asarray(train, np.int32), np.asarray(held, np.int32), held_names)
