"""A draft vocabulary (``SpecConfig.draft_vocab``): the MTP proposer drafts among a subset of ids
while verification stays over the full vocabulary. Speculative greedy equals plain greedy
(subsets that leave out tokens the target emits included), sampling stays lossless (chi-square
against the exact target law, with a negative control that puts q on the wrong ids), one compile
per vocabulary size, and every bad input is a clear error."""

from __future__ import annotations

import jax
import numpy as np
import pytest

import mtpspec
from mtpspec.decoding import draft_vocab as dvmod
from mtpspec.decoding.draft_vocab import DraftVocab
from mtpspec.decoding.proposers import mtp as mtp_proposer
from tests.test_sampling import (
    PROMPT,
    V,
    chi_square_p_value,
    exact_probs,
    first_three_counts,
    tiny_model,
)

PROMPTS = [[1, 2, 3, 4, 5, 6, 7, 1, 2, 3], [5, 3], [6, 6, 1]]


@pytest.fixture(scope="module")
def model():  # test_sampling's model: its MTP head's drafts are often accepted
    return tiny_model()


# ---- the value ---------------------------------------------------------------------------------


def test_made_from_counts_sorted_distinct_equal_by_value_and_saved(tmp_path):
    dv = DraftVocab.from_counts([5, 0, 9, 9, 1, 7], 3, source="test")
    assert dv.ids.tolist() == [2, 3, 5] and dv.size == 3 and dv.vocab_size == 6
    assert DraftVocab.from_counts([5, 0, 9, 9, 1, 7], 2).ids.tolist() == [2, 3]  # tie: lower id
    same = DraftVocab([5, 3, 2], vocab_size=6)
    assert same == dv and hash(same) == hash(dv)  # by ids, not by source or order given
    assert DraftVocab([5, 3, 2], vocab_size=7) != dv
    assert not dv.ids.flags.writeable
    assert DraftVocab.load(dv.save(tmp_path)) == dv and DraftVocab.load(tmp_path).source == "test"
    assert dv.coverage([[2, 3, 4, 5]]) == 0.75
    counts = dvmod.token_counts([[0, 1, 1], np.array([2, 1])], 4)
    assert counts.tolist() == [1, 3, 1, 0]
    seqs = [[1, 1, 1, 0], [2, 2]]
    assert DraftVocab.from_tokens(seqs, vocab_size=4, size=2).ids.tolist() == [1, 2]
    a = mtpspec.SpecConfig(draft_vocab=DraftVocab([1, 2], vocab_size=V))
    assert a == mtpspec.SpecConfig(draft_vocab=DraftVocab([2, 1], vocab_size=V))


@pytest.mark.parametrize(
    "make, error, match",
    [
        (lambda: DraftVocab([1, 1], vocab_size=4), ValueError, "1 appears twice"),
        (lambda: DraftVocab([0, 4], vocab_size=4), ValueError, r"\[0, 4\)"),
        (lambda: DraftVocab([-1], vocab_size=4), ValueError, r"\[0, 4\)"),
        (lambda: DraftVocab([], vocab_size=4), ValueError, "non-empty"),
        (lambda: DraftVocab([0.5], vocab_size=4), TypeError, "integers"),
        (lambda: DraftVocab([0], vocab_size=0), ValueError, "vocab_size"),
        (lambda: DraftVocab.from_counts([1, 2], 3), ValueError, "size must be an int in 1..2"),
        (lambda: dvmod.token_counts([[0, 9]], 4), ValueError, "token id 9 is outside"),
        (lambda: DraftVocab.load("/nonexistent/draft"), OSError, "no draft vocabulary"),
    ],
)
def test_bad_vocabularies_are_clear_errors(make, error, match):
    with pytest.raises(error, match=match):
        make()


def test_bad_settings_are_refused_before_device_work(model, tmp_path):
    config, params = model
    dv = DraftVocab([1, 2, 3], vocab_size=V)
    cases = [
        (dict(draft_vocab=[1, 2]), TypeError, "DraftVocab or None"),
        (dict(proposer="ngram", draft_vocab=dv), ValueError, "applies to the proposers"),
        (dict(num_draft=2, tree=(4, 1), draft_vocab=dv), ValueError, "only 3 ids"),
        (dict(draft_vocab=DraftVocab([1], vocab_size=V + 1)), ValueError, "vocabulary of 9"),
    ]
    for kwargs, error, match in cases:
        with pytest.raises(error, match=match):
            mtpspec.generate(
                config, params, PROMPTS, max_new_tokens=4, speculative=mtpspec.SpecConfig(**kwargs)
            )
    (tmp_path / dvmod.FILE).write_text("{not json")
    with pytest.raises(ValueError, match="not valid JSON"):
        DraftVocab.load(tmp_path)


# ---- exactness ---------------------------------------------------------------------------------


def test_speculative_greedy_equals_plain_greedy_for_every_subset(model):
    """Whole vocabulary, a subset, a subset without the tokens greedy emits most, one id: always
    plain greedy's tokens; the subset's own drafts are still accepted. Each subset with one
    (k, commit): every subset size is its own program."""
    config, params = model
    plain = mtpspec.generate(config, params, PROMPTS, max_new_tokens=24)
    emitted = np.concatenate(plain.tokens)
    common = np.bincount(emitted, minlength=V).argsort()[::-1]
    subsets = [list(range(V)), sorted(common[:5].tolist()), sorted(common[2:].tolist()), [0]]
    runs = [(1, "scan"), (3, "replay"), (3, "scan"), (1, "replay")]
    taus = []
    for ids, (k, commit) in zip(subsets, runs, strict=True):
        dv = DraftVocab(ids, vocab_size=V)
        spec = mtpspec.SpecConfig(num_draft=k, commit=commit, draft_vocab=dv)
        got = mtpspec.generate(config, params, PROMPTS, max_new_tokens=24, speculative=spec)
        assert got.tokens == plain.tokens, (ids, k, commit)
        taus.append(got.stats["tau"])
    assert dv.coverage(plain.tokens) < 1  # some emitted tokens were never draftable
    assert max(taus) > 1.3 and min(taus) >= 1.0


@pytest.mark.parametrize("tree", [(2, 1), (1, 3, 1)])
def test_a_tree_drafting_among_a_subset_equals_plain_greedy(model, tree):
    """Every node's children are the subset's top ids (mapped back onto the vocabulary): the
    tree's rows are drafts from the subset, verification is the target's."""
    config, params = model
    plain = mtpspec.generate(config, params, PROMPTS, max_new_tokens=24)
    common = np.bincount(np.concatenate(plain.tokens), minlength=V).argsort()[::-1]
    dv = DraftVocab(sorted(common[:5].tolist()), vocab_size=V)
    spec = mtpspec.SpecConfig(num_draft=len(tree), tree=tree, draft_vocab=dv)
    got = mtpspec.generate(config, params, PROMPTS, max_new_tokens=24, speculative=spec)
    assert got.tokens == plain.tokens
    assert got.stats["tau"] > 1.1  # the mapped drafts are accepted


def test_one_compile_per_vocabulary_size(model):
    config, params = model
    runs = []
    for ids in ([1, 2, 3, 4], [0, 5, 6, 7], [1, 2, 3, 4]):
        before = mtpspec.decoding.compile_count()
        spec = mtpspec.SpecConfig(num_draft=2, draft_vocab=DraftVocab(ids, vocab_size=V))
        mtpspec.generate(config, params, PROMPTS, max_new_tokens=8, speculative=spec)
        runs.append(mtpspec.decoding.compile_count() - before)
    assert runs[1:] == [0, 0]  # the ids are an argument of the program, the size its shape


# ---- lossless sampling -------------------------------------------------------------------------


def _first_three(model, ids, tree=None):
    dv = DraftVocab(ids, vocab_size=V)
    spec = mtpspec.SpecConfig(num_draft=2, commit="replay", draft_vocab=dv, tree=tree)
    counts, stats = first_three_counts(model, spec)
    return counts, stats["tau"]


SUBSET = [0, 2, 3, 5, 6]  # leaves out three ids that the target samples


@pytest.mark.slow(25)
def test_sampling_with_a_draft_vocabulary_matches_the_target_distribution(model):
    counts, tau = _first_three(model, SUBSET)
    want = exact_probs(*model, PROMPT, 3)
    assert want[..., [1, 4, 7]].sum() > 0.05  # the target often emits a token never drafted
    assert tau > 1.1  # drafts from the subset were accepted
    assert chi_square_p_value(counts, want) > 1e-3


@pytest.mark.slow(25)
def test_sampling_a_tree_with_a_draft_vocabulary_matches_the_target_distribution(model):
    """Two i.i.d. children per root drawn from the subset's law, verified by multi-candidate
    rejection over the full vocabulary."""
    counts, tau = _first_three(model, SUBSET, tree=(2, 1))
    assert tau > 1.1
    assert chi_square_p_value(counts, exact_probs(*model, PROMPT, 3)) > 1e-3


@pytest.mark.slow(25)
def test_negative_control_q_on_the_wrong_ids_fails_the_same_test(model, monkeypatch):
    """Verification told the subset's law sits on other ids (shifted by one place in the subset)
    is no longer lossless: the same test must reject it."""
    real = mtp_proposer.scatter_q
    mtpspec.decoding.release_compiled()  # the program cache would reuse the honest program
    monkeypatch.setattr(
        mtp_proposer, "scatter_q", lambda q, ids, vocab: real(q, jax.numpy.roll(ids, 1), vocab)
    )
    try:
        counts, _ = _first_three(model, SUBSET)
    finally:
        mtpspec.decoding.release_compiled()  # nor may a later test reuse the broken one
    assert chi_square_p_value(counts, exact_probs(*model, PROMPT, 3)) < 1e-6
