"""Speculative sampling is lossless (chi-square against the exact target distribution, with a
negative control), and the draft-model proposer is exact under greedy decoding."""

from __future__ import annotations

import itertools

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.scipy.special import gammaincc

import mtpspec
from mtpspec import config as C
from mtpspec import models
from mtpspec.decoding.sampling import filtered_log_probs, speculative_accept

V = 8  # tiny vocabulary: every joint outcome of a few tokens is a chi-square cell
T, TOP_K, TOP_P = 0.8, 6, 0.95  # exercise the filters: p and q use the same settings
N = 10_000
PROMPT = [1, 2, 3, 4, 5]


def tiny_model():
    """The sampling tests' target (its MTP head's drafts are often accepted); other test modules
    make the same one."""
    config = C.tiny_moe(vocab_size=V, **C.TWO_LAYERS)
    return config, models.init_params(config, jax.random.key(3), norm_scale=0.1)


def tiny_draft_model():
    """A draft model for ``tiny_model`` (same vocabulary, no MTP head)."""
    dconfig = C.tiny_hybrid(
        vocab_size=V,
        layer_types=("linear_attention", "full_attention"),
        mlp_types=("dense", "dense"),
        mtp_num_layers=0,
    )
    return dconfig, models.init_params(dconfig, jax.random.key(5), norm_scale=0.1)


def first_three_counts(model, spec):
    """Speculative sampling of ``N`` continuations of PROMPT, 3 tokens each, at (T, TOP_K,
    TOP_P): (counts [V, V, V] of the joint outcomes, the result's stats)."""
    config, params = model
    result = mtpspec.generate(
        config, params, [PROMPT] * N, max_new_tokens=3, speculative=spec,
        temperature=T, top_k=TOP_K, top_p=TOP_P, seed=0,
    )  # fmt: skip
    seqs = np.asarray(result.tokens)
    counts = np.zeros((V, V, V))
    np.add.at(counts, (seqs[:, 0], seqs[:, 1], seqs[:, 2]), 1)
    return counts, result.stats


@pytest.fixture(scope="module")
def model():
    return tiny_model()


def chi_square_p_value(counts: np.ndarray, probs: np.ndarray) -> float:
    """Pearson goodness of fit; cells expecting < 5 samples are pooled into one."""
    n = counts.sum()
    expected = probs.ravel() * n
    counts = counts.ravel().astype(np.float64)
    big = expected >= 5
    stat = np.sum((counts[big] - expected[big]) ** 2 / expected[big])
    df = int(big.sum()) - 1
    rest_e, rest_c = expected[~big].sum(), counts[~big].sum()
    if rest_e > 0:
        stat += (rest_c - rest_e) ** 2 / rest_e
        df += 1
    return float(gammaincc(df / 2.0, stat / 2.0))


def exact_probs(config, params, prefix: list[int], depth: int) -> np.ndarray:
    """P(t_1..t_depth | prefix) under the filtered target distribution, shape [V] * depth."""
    conts = np.array(list(itertools.product(range(V), repeat=depth - 1)), np.int32)
    conts = conts.reshape(-1, depth - 1)
    toks = np.concatenate([np.tile(prefix, (len(conts), 1)), conts], axis=1)
    logp = np.asarray(filtered_log_probs(models.forward(config, params, toks), T, TOP_K, TOP_P))
    start = len(prefix) - 1
    total = np.zeros((V,) * depth)
    for row, cont in enumerate(conts):
        prob = np.exp(logp[row, start : start + depth])  # prob[i]: law of t_{i+1} given t_1..t_i
        head = np.prod([prob[i, cont[i]] for i in range(depth - 1)])
        total[tuple(cont)] = head * prob[depth - 1]
    return total


# ---- one verify step, vmapped over 10^4 keys ---------------------------------------------------


def _one_step_samples(config, params, key, residual=True):
    """Draws (e1, e2) from one speculative step with k = 2 MTP-like drafts (q from the model's
    MTP head, so q != p), completed by an exact target sample when only one token was emitted."""
    pending = 6
    windows = np.array([[pending, a, b] for a in range(V) for b in range(V)], np.int32)
    toks = jnp.asarray(np.concatenate([np.tile(PROMPT, (V * V, 1)), windows], axis=1))
    logits, hidden = models.forward_hidden(config, params, toks)
    logits = logits[:, len(PROMPT) :].reshape(V, V, 3, V)  # [d1, d2, window position, V]
    # q: the MTP head's filtered distributions (row i pairs h_i with token i+1, predicts i+2):
    # row P−1 drafts d1 after the pending token, row P drafts d2 after d1. Any q != p will do.
    mtp_logits, _ = models.mtp_forward(config, params, hidden[:, :-1], toks[:, 1:])
    q_all = jnp.exp(filtered_log_probs(mtp_logits, T, TOP_K, TOP_P))
    q1 = q_all[0, len(PROMPT) - 1]
    q2 = q_all[::V, len(PROMPT)]  # [d1, V]

    def one(key):
        k1, k2, k3, k4 = jax.random.split(key, 4)
        d1 = jax.random.categorical(k1, jnp.log(q1))
        d2 = jax.random.categorical(k2, jnp.log(q2[d1]))
        drafts = jnp.stack([d1, d2])[None].astype(jnp.int32)
        q = jnp.stack([q1, q2[d1]])[None]
        a, tok = speculative_accept(
            k3, logits[d1, d2][None], drafts, q, T, TOP_K, TOP_P, residual=residual
        )
        a, tok = a[0], tok[0]
        # a = 0: only `tok` emitted; the next token comes from the exact target given tok.
        nxt = jax.random.categorical(k4, filtered_log_probs(logits[tok, 0, 1], T, TOP_K, TOP_P))
        e1 = jnp.where(a >= 1, d1, tok)
        e2 = jnp.where(a >= 2, d2, jnp.where(a == 1, tok, nxt))
        return e1, e2, a

    return jax.jit(jax.vmap(one))(jax.random.split(key, N))


def _joint_counts(e1, e2):
    counts = np.zeros((V, V))
    np.add.at(counts, (np.asarray(e1), np.asarray(e2)), 1)
    return counts


def test_rejection_sampling_is_lossless_over_two_tokens(model):
    config, params = model
    e1, e2, a = _one_step_samples(config, params, jax.random.key(0))
    want = exact_probs(config, params, PROMPT + [6], 2)
    assert 0 < float(jnp.mean(a)) < 2  # drafts are sometimes accepted, sometimes not
    assert chi_square_p_value(_joint_counts(e1, e2), want) > 1e-3


def test_negative_control_wrong_residual_rule_fails_the_same_test(model):
    """Resampling from p (not max(0, p − q)) after a rejection is biased: the test must see it."""
    config, params = model
    e1, e2, _ = _one_step_samples(config, params, jax.random.key(0), residual=False)
    want = exact_probs(config, params, PROMPT + [6], 2)
    assert chi_square_p_value(_joint_counts(e1, e2), want) < 1e-6


@pytest.mark.slow(25)
def test_generate_speculative_sampling_matches_target_distribution(model):
    """End to end through the on-device loop: 10^4 copies of one prompt, the joint law of the
    first three generated tokens (prefill token + one MTP verify step and beyond) is the
    target's."""
    config, params = model
    spec = mtpspec.SpecConfig(proposer="mtp", num_draft=2, commit="replay")
    counts, stats = first_three_counts(model, spec)
    assert stats["tau"] > 1.2  # drafts were accepted: the test exercises acceptance
    assert chi_square_p_value(counts, exact_probs(config, params, PROMPT, 3)) > 1e-3


# ---- reproducibility and limits ----------------------------------------------------------------


def test_filters_keep_top_k_and_nucleus():
    logits = jnp.log(jnp.asarray([[0.5, 0.2, 0.15, 0.1, 0.05]]))
    kept = np.isfinite(np.asarray(filtered_log_probs(logits, 1.0, 2, 1.0)))[0]
    assert kept.tolist() == [True, True, False, False, False]
    kept = np.isfinite(np.asarray(filtered_log_probs(logits, 1.0, 0, 0.8)))[0]
    assert kept.tolist() == [True, True, True, False, False]  # 0.5 + 0.2 < 0.8 <= + 0.15
    probs = np.exp(np.asarray(filtered_log_probs(logits, 1.0, 0, 1.0)))[0]
    np.testing.assert_allclose(probs, [0.5, 0.2, 0.15, 0.1, 0.05], rtol=1e-5)


@pytest.fixture(scope="module")
def draft_model():
    return tiny_draft_model()


PROMPTS = [[1, 2, 3, 4, 5, 6, 7, 1, 2, 3], [5, 3]]


@pytest.mark.parametrize("proposer", ["mtp", "ngram", "draft"])
def test_temperature_to_zero_equals_greedy_and_seed_reproduces(model, draft_model, proposer):
    config, params = model
    dconfig, dparams = draft_model
    spec = mtpspec.SpecConfig(
        proposer=proposer, num_draft=3, draft_config=dconfig, draft_params=dparams
    )
    greedy = mtpspec.generate(config, params, PROMPTS, max_new_tokens=16)  # same as below
    cold = mtpspec.generate(
        config, params, PROMPTS, max_new_tokens=16, speculative=spec, temperature=1e-5
    )
    assert cold.tokens == greedy.tokens
    hot = [
        mtpspec.generate(
            config, params, PROMPTS, max_new_tokens=16, speculative=spec, temperature=1.0, seed=s
        ).tokens
        for s in (4, 4, 5)
    ]
    assert hot[0] == hot[1] and hot[0] != hot[2]


@pytest.mark.parametrize("strategy", ["scan", "states", "replay"])
def test_draft_model_greedy_equals_plain_greedy(model, draft_model, strategy):
    config, params = model
    dconfig, dparams = draft_model
    plain = mtpspec.generate(config, params, PROMPTS, max_new_tokens=16)
    for prompts in (PROMPTS, PROMPTS[:1]) if strategy == "scan" else (PROMPTS,):
        spec = mtpspec.SpecConfig(
            proposer="draft", num_draft=3, commit=strategy, draft_config=dconfig,
            draft_params=dparams,
        )  # fmt: skip
        result = mtpspec.generate(config, params, prompts, max_new_tokens=16, speculative=spec)
        assert result.tokens == plain.tokens[: len(prompts)]


@pytest.mark.parametrize("temperature", [0.0, 1.0])
def test_target_as_its_own_draft_accepts_everything(model, temperature):
    """p == q: every draft is accepted (every step verifies k + 1 tokens; τ counts those emitted,
    so the last step's cut tail is not), greedy or sampled; the draft model's own hybrid state is
    committed every step."""
    config, params = model
    spec = mtpspec.SpecConfig(
        proposer="draft", num_draft=3, commit="scan", draft_config=config, draft_params=params
    )
    result = mtpspec.generate(
        config, params, PROMPTS, max_new_tokens=16, speculative=spec, temperature=temperature
    )
    assert result.stats["position_acceptance"] == [1.0, 1.0, 1.0]
    assert all(a == 3 for seq in result.stats["accepted"] for a in seq if a >= 0)
    steps, emitted = sum(result.stats["steps"]), sum(result.stats["emitted"])
    assert result.stats["tau"] == pytest.approx(emitted / steps)
    assert emitted == sum(len(t) - 1 for t in result.tokens)
    if temperature == 0.0:
        assert result.tokens == mtpspec.generate(config, params, PROMPTS, max_new_tokens=16).tokens


def test_draft_model_errors(model, draft_model):
    config, params = model
    dconfig, dparams = draft_model
    import dataclasses

    bad_vocab = dataclasses.replace(dconfig, vocab_size=V + 1)
    cases = [
        (mtpspec.SpecConfig(proposer="draft"), ValueError, "needs draft_config"),
        (
            mtpspec.SpecConfig(proposer="draft", draft_config=bad_vocab, draft_params=dparams),
            ValueError,
            "vocabulary",
        ),
        (
            mtpspec.SpecConfig(proposer="draft", draft_config=dconfig, draft_params=[1]),
            TypeError,
            "parameter tree",
        ),
        (
            mtpspec.SpecConfig(
                proposer="draft",
                draft_config=dataclasses.replace(dconfig, hidden_size=32),
                draft_params=dparams,
            ),
            ValueError,
            "draft_params",
        ),
    ]
    for spec, exc, match in cases:
        with pytest.raises(exc, match=match):
            mtpspec.generate(config, params, [[1, 2]], max_new_tokens=4, speculative=spec)
