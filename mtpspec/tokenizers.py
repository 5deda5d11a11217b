"""Tokenizers: text <-> token ids.

ByteTokenizer         UTF-8 bytes as ids 0..255 (the shipped model's vocabulary)
byte_tokenizer_json   the same as a Hugging Face ``tokenizer.json`` dict (for HF export)
HFTokenizer           a Hugging Face ``tokenizer.json`` through the ``tokenizers`` package
"""

from __future__ import annotations

import os
import pathlib


class ByteTokenizer:
    """UTF-8 bytes as token ids 0..255."""

    vocab_size = 256

    def encode(self, text: str) -> list[int]:
        # surrogateescape: text that came from bytes that are not UTF-8 (argv, file names, read
        # with errors="surrogateescape") encodes back to exactly those bytes
        return list(text.encode("utf-8", "surrogateescape"))

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
