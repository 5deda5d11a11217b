"""``SpecConfig``: what speculative decoding to run, and its checks (host side, before any device
work).

The default commit strategy is stated here once (``DEFAULT_COMMIT``) and used by ``SpecConfig``,
the CLI flags and every script. It is "replay": on the shipped model it costs the same as
"states" and less than "scan" per commit, and keeps 7× less commit data than "states" (which
stores k + 1 GDN states per layer: 72 MiB per window position and sequence on Qwen3-Next-80B);
docs/design.md compares the three.
"""

from __future__ import annotations

import dataclasses
import numbers
from typing import Any

from mtpspec.config import ModelConfig
from mtpspec.decoding.commit import COMMIT_STRATEGIES
from mtpspec.decoding.draft_vocab import DraftVocab
from mtpspec.models.tree import check_tree
from mtpspec.ops import GDN_METHODS

DEFAULT_COMMIT = "replay"
DEFAULT_NUM_DRAFT = 2
VERIFY_METHODS = GDN_METHODS
TREE_PROPOSERS = ("mtp", "ngram", "draft")  # the proposers that draft trees
DRAFT_VOCAB_PROPOSERS = ("mtp",)  # the proposers that draft among a ``DraftVocab``


@dataclasses.dataclass(frozen=True, eq=False)
class SpecConfig:
    """Speculative decoding settings.

    proposer: a registered proposer name (``decoding.proposers.names()``): "mtp" (the model's MTP
    head, chained for k > 1), "ngram" (prompt lookup over each sequence's history, n in
    ngram_min..ngram_max), "draft" (a separate mtpspec model sharing the vocabulary:
    ``draft_config``, ``draft_params``; its state is committed like the target's).
    num_draft: k drafts per verify step. commit: "scan" | "states" | "replay" (equal results;
    default ``DEFAULT_COMMIT``). verify_method: GDN form inside the verify window ("auto" asks
    ``ops.resolve_gdn_method``).
    tree: None (a chain of num_draft drafts) or (b_1, ..., b_d) with d = num_draft: a static
    draft tree with b_i children per node at depth i, verified in one window of all its nodes
    (``models.tree``); proposers "mtp" and "draft" (greedy: the top b_i children; sampling:
    b_i i.i.d. draws) and "ngram" (the distinct continuations in the history), verified
    losslessly when sampling (``sampling.tree_speculative_accept``).
    p_min, adaptive: drafting that adapts, exactly (chains only; ``decoding.adaptive``). p_min
    in [0, 1): a sequence drafts position i only while the draft distribution's largest
    probability there (the model's own softmax, temperature 1) is at least p_min, so the verify
    window shrinks to the drafts worth checking (llama.cpp's ``--spec-draft-p-min``); the rule
    reads only what is known before the draft is drawn, so sampling stays lossless. adaptive:
    each sequence's own draft length, 1..num_draft, follows an exponential average of its
    accepted drafts with hysteresis (SGLang's policy). Either one compiles one program per
    num_draft whose window is chosen per step among lengths 1..num_draft + 1 (``lax.switch``):
    p_min and the adaptive flag travel as arrays, so changing them never recompiles.
    draft_vocab: None (draft among the whole vocabulary) or a ``DraftVocab``: the MTP proposer
    drafts among its ids only (each draft's LM head is its size, not the vocabulary's);
    verification stays over the full vocabulary, so greedy output is unchanged and sampling stays
    lossless (``decoding.draft_vocab``). Chains and trees (a tree's widest branching at most
    the subset's size).

    Two SpecConfigs are equal (and hash alike) when every setting is equal and ``draft_params``
    is the same object (weights are compared by identity: comparing arrays element by element
    would be slow and ambiguous).
    """

    proposer: str = "mtp"
    num_draft: int = DEFAULT_NUM_DRAFT
    commit: str = DEFAULT_COMMIT
    verify_method: str = "auto"
    ngram_min: int = 1
    ngram_max: int = 3
    draft_config: ModelConfig | None = None
    draft_params: Any = None
    tree: tuple[int, ...] | None = None
    draft_vocab: DraftVocab | None = None
    p_min: float = 0.0
    adaptive: bool = False

    @property
    def adapts(self) -> bool:
        """Whether the draft length adapts per step (p_min > 0 or the adaptive policy)."""
        return self.p_min > 0 or self.adaptive

    def _settings(self) -> tuple:
        fields = dataclasses.fields(self)
        return tuple(getattr(self, f.name) for f in fields if f.name != "draft_params")

    def __eq__(self, other) -> bool:
        if not isinstance(other, SpecConfig):
            return NotImplemented
        return self.draft_params is other.draft_params and self._settings() == other._settings()

    def __hash__(self) -> int:
        return hash((self._settings(), id(self.draft_params)))

    def validate(self, config: ModelConfig, params) -> None:
        """Raise ValueError / TypeError naming the first problem with these settings for the
        target ``config`` / ``params`` (the proposer checks its own options)."""
        from mtpspec.decoding import proposers

        k = self.num_draft
        if isinstance(k, bool) or not isinstance(k, int) or k < 1:
            raise ValueError(f"num_draft must be an int >= 1, got {k!r}")
        if self.commit not in COMMIT_STRATEGIES:
            raise ValueError(
                f"unknown commit strategy {self.commit!r}; expected one of {COMMIT_STRATEGIES}"
            )
        if self.verify_method not in VERIFY_METHODS:
            raise ValueError(
                f"unknown verify_method {self.verify_method!r}; expected one of {VERIFY_METHODS}"
            )
        if self.tree is not None:
            shape = check_tree(self.tree)
            if shape.depth != k:
                raise ValueError(
                    f"tree {shape.branching} has depth {shape.depth}; it must equal num_draft={k}"
                )
            if self.verify_method != "auto":
                raise ValueError(
                    f"verify_method={self.verify_method!r} does not apply to a tree: its window "
                    "runs the per-depth GDN recurrence (models.tree); leave it 'auto'"
                )
            if self.proposer not in TREE_PROPOSERS:
                raise ValueError(
                    f"tree speculation runs with the proposers {TREE_PROPOSERS} so far, "
                    f"not {self.proposer!r}"
                )
        if self.draft_vocab is not None:
            self._check_draft_vocab(config)
        self._check_adaptive()
        proposers.lookup(self.proposer).check(self, config, params)

    def _check_adaptive(self) -> None:
        p = self.p_min
        if isinstance(p, bool) or not isinstance(p, numbers.Real):
            raise TypeError(f"p_min must be a float in [0, 1), got {type(p).__name__}")
        if not 0.0 <= p < 1.0:  # also refuses NaN
            raise ValueError(f"p_min must be in [0, 1), got {p!r}")
        if not isinstance(self.adaptive, bool):
            raise TypeError(f"adaptive must be a bool, got {type(self.adaptive).__name__}")
        if self.adapts and self.tree is not None:
            raise ValueError(
                "p_min / adaptive apply to chains so far (a tree's window is fixed); "
                "leave tree=None or drop them"
            )

    def _check_draft_vocab(self, config: ModelConfig) -> None:
        dv = self.draft_vocab
        if not isinstance(dv, DraftVocab):
            raise TypeError(f"draft_vocab must be a DraftVocab or None, got {type(dv).__name__}")
        if self.proposer not in DRAFT_VOCAB_PROPOSERS:
            raise ValueError(
                f"draft_vocab applies to the proposers {DRAFT_VOCAB_PROPOSERS}, "
                f"not {self.proposer!r}"
            )
        widest = max(check_tree(self.tree).branching) if self.tree is not None else 1
        if widest > dv.size:
            raise ValueError(
                f"tree {self.tree} drafts up to {widest} children per node; draft_vocab has "
                f"only {dv.size} ids"
            )
        if dv.vocab_size != config.vocab_size:
            raise ValueError(
                f"draft_vocab was made for a vocabulary of {dv.vocab_size} ids; this model has "
                f"{config.vocab_size}"
            )
