"""Decoding: generate (plain / speculative, one on-device loop), commit, proposers, sampling."""

from mtpspec.decoding.commit import COMMIT_STRATEGIES, commit_window, rewind_kv_only
from mtpspec.decoding.loop import (
    GenerateResult,
    SpecConfig,
    compile_count,
    generate,
    generate_stream,
)
from mtpspec.decoding.proposers import ngram_propose

__all__ = [
    "COMMIT_STRATEGIES",
    "GenerateResult",
    "SpecConfig",
    "commit_window",
    "compile_count",
    "generate",
    "generate_stream",
    "ngram_propose",
    "rewind_kv_only",
]
