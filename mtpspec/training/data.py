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
