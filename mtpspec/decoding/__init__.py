"""Decoding: plain and speculative generation as one on-device loop.

api.py        generate / generate_stream / prepare (the public entry points)
spec.py       SpecConfig, DEFAULT_COMMIT
draft_vocab.py  DraftVocab: the ids a proposer drafts among (verification keeps the full vocabulary)
program.py    the jitted program: prefill + while_loop of verify steps, the compile cache
stages.py     the stages of one step: verify, accept, commit, emit
proposers/    one module per proposer behind one protocol (mtp, ngram, draft)
commit.py     commit strategies (scan / states / replay) and the negative control
sampling.py   greedy / temperature / top-k / top-p, lossless rejection sampling
host.py       argument checks, buckets, the capacity formula, device placement
stats.py      τ and per-position acceptance (one definition)
"""

from mtpspec.decoding.api import (
    GenerateResult,
    Prepared,
    compile_count,
    generate,
    generate_stream,
    prepare,
    release_compiled,
    set_compile_cache_size,
    stream_steps,
)
from mtpspec.decoding.commit import COMMIT_STRATEGIES, commit_window, rewind_kv_only
from mtpspec.decoding.draft_vocab import DraftVocab
from mtpspec.decoding.host import BUCKET, default_capacity
from mtpspec.decoding.proposers.ngram import ngram_propose
from mtpspec.decoding.spec import DEFAULT_COMMIT, DEFAULT_NUM_DRAFT, SpecConfig

__all__ = [
    "BUCKET",
    "COMMIT_STRATEGIES",
    "DEFAULT_COMMIT",
    "DEFAULT_NUM_DRAFT",
    "DraftVocab",
    "GenerateResult",
    "Prepared",
    "SpecConfig",
    "commit_window",
    "compile_count",
    "default_capacity",
    "generate",
    "generate_stream",
    "ngram_propose",
    "prepare",
    "release_compiled",
    "rewind_kv_only",
    "set_compile_cache_size",
    "stream_steps",
]
