"""Offline text data: the Python standard library's own source, selected by a hashed manifest.

Every machine with this Python has the corpus, so nothing is downloaded. ``build_manifest`` picks
files and records their sha256; ``load_corpus`` reads exactly those files, refuses any whose hash
differs (reproducibility), and splits train / held-out by file (a hash of the path). Batches are a
pure function of (seed, step), so a resumed run sees the same data order.

The split (``split_documents``, for the manifest and for your own text): by document when that
gives each split at least one sequence (seq_len + 1 tokens); otherwise by tokens — the documents
joined in order and the last ``eval_fraction`` of the tokens (whole windows of seq_len + 1, at
least one) held out — so one small file or a few documents shorter than a sequence still split.
Too little text for that is a ValueError naming seq_len, the token counts and what would fix it.

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
    train: np.ndarray  # tokens of the training split, concatenated (uint8 bytes for the manifest)
    eval: np.ndarray  # tokens of the held-out split
    eval_files: list[str]  # the held-out documents (by tokens: every document the tail touches)
    split: str = "by document"  # how it was split, in words


def _check_fraction(eval_fraction) -> None:
    number = isinstance(eval_fraction, int | float | np.integer | np.floating)
    if isinstance(eval_fraction, bool) or not number or not 0 <= eval_fraction < 1:
        raise ValueError(f"eval_fraction must be a number in [0, 1), got {eval_fraction!r}")


def split_documents(
    docs: list[tuple[str, np.ndarray]],
    *,
    eval_fraction: float = 0.1,
    seq_len: int = 128,
    min_tokens: int = 2,
    where: str = "the data",
) -> Corpus:
    """Train / held-out ``Corpus`` from (key, tokens) documents, each split at least
    ``max(min_tokens, seq_len + 1)`` tokens (one training window). By document (``is_eval_file``
    of the key; with none held out, the last document) when that gives both splits enough;
    otherwise by tokens (``_split_tokens``). ValueError when the text cannot give both."""
    _check_fraction(eval_fraction)
    if isinstance(seq_len, bool) or not isinstance(seq_len, int | np.integer) or seq_len < 1:
        raise ValueError(f"seq_len must be an int >= 1, got {seq_len!r}")
    need = max(int(min_tokens), int(seq_len) + 1)
    held_keys = [k for k, _ in docs if is_eval_file(k, eval_fraction)]
    if not held_keys and len(docs) > 1:  # few documents: hold the last one out
        held_keys = [docs[-1][0]]
    held_set = set(held_keys)
    train = [ids for k, ids in docs if k not in held_set]
    held = [ids for k, ids in docs if k in held_set]
    n_train, n_held = sum(map(len, train)), sum(map(len, held))
    if n_train >= need and n_held >= need:
        return Corpus(
            np.concatenate(train), np.concatenate(held), held_keys,
            f"by document: {len(held_keys)} of {len(docs)} documents held out",
        )  # fmt: skip
    return _split_tokens(docs, eval_fraction, int(seq_len), need, where, (n_train, n_held))


def _split_tokens(docs, eval_fraction, seq_len, need, where, by_document) -> Corpus:
    """The documents joined in order; the last ``eval_fraction`` of the tokens held out, as whole
    windows of seq_len + 1 (at least one, and at least ``need`` tokens), leaving training at
    least ``need``."""
    stream = np.concatenate([ids for _, ids in docs]) if docs else np.zeros(0, np.int32)
    total, window = len(stream), seq_len + 1
    if total < 2 * need:
        fit = total // 2 - 1  # the largest seq_len whose two windows this text holds
        fixes = "give more text" + (f", or a smaller --seq_len (at most {fit})" if fit >= 1 else "")
        raise ValueError(
            f"{where}: too little text for seq_len={seq_len}: {total} tokens in all "
            f"({len(docs)} document{'s' if len(docs) != 1 else ''}: {by_document[0]} training "
            f"and {by_document[1]} held-out tokens split by document), but the training and the "
            f"held-out split need at least {need} tokens each (seq_len + 1), {2 * need} in all; "
            f"{fixes}"
        )
    windows = max(1, round(eval_fraction * total / window))
    held_len = max(need, min(windows * window, (total - need) // window * window))
    start = total - held_len
    held_keys, offset = [], 0
    for key, ids in docs:
        offset += len(ids)
        if offset > start:
            held_keys.append(key)
    split = (
        f"by tokens: the last {held_len:,} of {total:,} tokens ({held_len // window} windows of "
        f"seq_len + 1) held out"
    )
    return Corpus(stream[:start], stream[start:], held_keys, split)


def check_split(tokens: np.ndarray, name: str, seq_len: int) -> None:
    """ValueError unless the ``name`` split holds one sequence (seq_len + 1 tokens)."""
    n = len(tokens)
    if n >= seq_len + 1:
        return
    fixes = "give more text" + (f", a smaller --seq_len (at most {n - 1})" if n >= 2 else "")
    raise ValueError(
        f"the {name} split has {n} tokens{' (it is empty)' if n == 0 else ''}, fewer than one "
        f"sequence: seq_len={seq_len} needs at least {seq_len + 1} tokens per split; {fixes}, or "
        "a different held-out fraction (eval_fraction)"
    )


def load_corpus(
    manifest: dict | str | os.PathLike,
    *,
    eval_fraction: float = 0.1,
    root: pathlib.Path | None = None,
    seq_len: int = 128,
) -> Corpus:
    """Read the manifest's files, verifying every hash; split by file into train / held-out
    (``split_documents``: by tokens when the files cannot give each split a ``seq_len`` window)."""
    if not isinstance(manifest, dict):
        with open(manifest) as f:
            manifest = json.load(f)
    root = root or stdlib_root()
    docs = []
    for entry in manifest["files"]:
        path = root / entry["path"]
        if not path.is_file():
            raise OSError(f"corpus file missing: {path} (manifest built on another Python?)")
        data = path.read_bytes()
        if hashlib.sha256(data).hexdigest() != entry["sha256"]:
            raise ValueError(f"corpus file {path} does not match its manifest hash")
        docs.append((entry["path"], np.frombuffer(data + b"\n\n", np.uint8)))
    where = f"the manifest's {len(docs)} files"
    return split_documents(docs, eval_fraction=eval_fraction, seq_len=seq_len, where=where)


def batch_at(data: np.ndarray, step: int, *, batch: int, seq_len: int, seed: int) -> np.ndarray:
    """Training batch for ``step``: [batch, seq_len + 1] int32 windows at positions drawn from
    a generator seeded by (seed, step) — the data order is a function of the step alone."""
    check_split(data, "training", seq_len)
    rng = np.random.default_rng([seed, step])
    # the same draws as ever for longer data; data of exactly one window gives that window
    starts = rng.integers(0, max(len(data) - seq_len - 1, 1), size=batch)
    return np.stack([data[s : s + seq_len + 1] for s in starts]).astype(np.int32)


def eval_batches(data: np.ndarray, *, batch: int, seq_len: int, count: int) -> list[np.ndarray]:
    """Fixed, evenly spaced held-out windows."""
    check_split(data, "held-out", seq_len)
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
    seq_len: int = 128,
    min_tokens: int = 2,
) -> Corpus:
    """Tokenized training data from ``path``: a text file, a directory of text files, or a JSONL
    file with a ``text`` field per line. Documents (files; JSONL lines; ~64k-character pieces of
    one big file) end with the tokenizer's first EOS id (or a blank line for a tokenizer with
    no EOS, e.g. bytes) and go to train or held-out by a hash of their name (``is_eval_file``),
    or, when that leaves a split without one ``seq_len`` window, by tokens
    (``split_documents``). Returns ``Corpus`` with int32 token arrays; ValueError naming
    seq_len and the token counts when the text cannot give both splits ``max(min_tokens,
    seq_len + 1)`` tokens."""
    path = pathlib.Path(path)
    docs = [(k, t) for k, t in _documents(path) if t.strip()]
    if not docs:
        raise ValueError(f"no text found in {path}")
    eos = list(getattr(tokenizer, "eos_token_ids", ()) or ())
    sep = eos[:1] if eos else tokenizer.encode("\n\n")
    tokens = [(key, np.asarray([*tokenizer.encode(text), *sep], np.int32)) for key, text in docs]
    return split_documents(
        tokens, eval_fraction=eval_fraction, seq_len=seq_len, min_tokens=min_tokens, where=str(path)
    )
