"""Sampling settings as data (per-row arrays: no recompiles, per-row settings, per-row seeds),
min-p, several EOS ids, and the log-probabilities of emitted tokens."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import mtpspec
from mtpspec import config as C
from mtpspec import decoding, models
from mtpspec.decoding.sampling import filtered_log_probs, seed_key, seed_keys

V = 32
PROMPTS = [[1, 2, 3, 4, 5, 6, 7, 1, 2, 3], [5, 3], [9, 9, 4, 2, 7]]
NEW = 14


@pytest.fixture(scope="module")
def model():
    config = C.tiny_moe(vocab_size=V, **C.TWO_LAYERS)
    return config, models.init_params(config, jax.random.key(11), norm_scale=0.1)


def _gen(model, prompts=PROMPTS, **kw):
    config, params = model
    return mtpspec.generate(config, params, prompts, max_new_tokens=kw.pop("new", NEW), **kw)


# ---- the filters against a NumPy oracle of transformers' order ----------------------------------


def reference_log_probs(logits, temperature, top_k, top_p, min_p):
    """NumPy, one row, written from the definitions: temperature, top-k (ties kept), top-p over
    the renormalised survivors (the smallest prefix by descending probability whose mass reaches
    top_p), then min-p relative to the most likely survivor."""
    x = np.asarray(logits, np.float64)
    if temperature == 0:
        out = np.full_like(x, -np.inf)
        out[np.argmax(x)] = 0.0
        return out
    z = (x - x.max()) / temperature
    keep = np.ones_like(z, bool)
    if 0 < top_k < len(z):
        keep &= z >= np.sort(z)[::-1][top_k - 1]
    if top_p < 1:
        p = np.where(keep, np.exp(z), 0.0)
        p /= p.sum()
        order = np.argsort(-z, kind="stable")
        mass_before = np.cumsum(p[order]) - p[order]
        chosen = order[(mass_before < top_p) & keep[order]]
        keep &= z >= z[chosen].min()
    if min_p > 0:
        keep &= np.exp(z) >= min_p * np.exp(z[keep].max())
    z = np.where(keep, z, -np.inf)
    return z - np.log(np.sum(np.exp(z[keep])))


_FILTERED = jax.jit(filtered_log_probs)  # settings as traced scalars, as inside a decoding program


@settings(max_examples=60, deadline=None)
@given(
    seed=st.integers(0, 2**16),
    temperature=st.sampled_from([0.0, 0.3, 1.0, 2.5]),
    top_k=st.integers(0, 12),
    top_p=st.sampled_from([1.0, 0.95, 0.7, 0.3, 0.05]),
    min_p=st.sampled_from([0.0, 0.05, 0.2, 0.6]),
)
def test_filters_match_the_reference_order(seed, temperature, top_k, top_p, min_p):
    logits = np.random.default_rng(seed).normal(0, 2, (10,)).astype(np.float32)
    want = reference_log_probs(logits, temperature, top_k, top_p, min_p)
    settings = (np.float32(temperature), np.int32(top_k), np.float32(top_p), np.float32(min_p))
    got = np.asarray(_FILTERED(jnp.asarray(logits[None]), *settings))  # one compile, 60 examples
    assert (np.isfinite(got[0]) == np.isfinite(want)).all()
    np.testing.assert_allclose(got[0][np.isfinite(want)], want[np.isfinite(want)], atol=1e-5)


def test_per_row_filters_equal_one_row_at_a_time():
    rng = np.random.default_rng(0)
    logits = jnp.asarray(rng.normal(0, 2, (4, 3, 16)).astype(np.float32))
    rows = dict(
        temperature=np.array([0.0, 0.5, 1.0, 1.7], np.float32),
        top_k=np.array([0, 3, 0, 8], np.int32),
        top_p=np.array([1.0, 1.0, 0.6, 0.9], np.float32),
        min_p=np.array([0.0, 0.1, 0.0, 0.3], np.float32),
    )
    got = np.asarray(filtered_log_probs(logits, *rows.values()))
    for i in range(4):
        one = filtered_log_probs(logits[i], *(float(v[i]) for v in rows.values()))
        np.testing.assert_array_equal(got[i], np.asarray(one))


# ---- settings as arrays: one compile, per-row settings and seeds --------------------------------


def test_a_sweep_over_temperatures_and_filters_compiles_once(model):
    new = 11  # a max_new_tokens bucket of its own: no other test warms this program
    _gen(model, temperature=0.5, seed=0, new=new)
    before = decoding.compile_count()
    outs = [
        _gen(model, temperature=t, top_k=k, top_p=p, min_p=m, seed=s, new=new).tokens
        for t, k, p, m, s in [
            (0.7, 0, 1.0, 0.0, 0),
            (1.0, 5, 1.0, 0.0, 1),
            (1.3, 0, 0.9, 0.0, 2),
            (2.0, 0, 1.0, 0.1, 3),
            (1e-6, 3, 0.5, 0.2, 4),
        ]
    ]
    assert decoding.compile_count() == before
    assert len({str(o) for o in outs}) > 1


def test_speculative_sweep_compiles_once(model):
    spec = mtpspec.SpecConfig(proposer="mtp", num_draft=2)
    _gen(model, speculative=spec, temperature=0.9, new=13)
    before = decoding.compile_count()
    for t in (0.2, 0.6, 1.1, 1.6):
        _gen(model, speculative=spec, temperature=t, top_p=0.9, new=13)
    assert decoding.compile_count() == before


@pytest.mark.parametrize("proposer", [None, "mtp", "ngram"])
def test_each_row_draws_as_if_alone(model, proposer):
    """Per-row settings and seeds: row i of a mixed batch equals a one-prompt call with row i's
    settings and seed; a temperature-0 row inside a sampled program is plain greedy exactly."""
    spec = None if proposer is None else mtpspec.SpecConfig(proposer=proposer, num_draft=3)
    temps, tops, seeds = [0.0, 1.0, 0.8], [0, 0, 6], [7, 8, 9]
    batch = _gen(model, speculative=spec, temperature=temps, top_k=tops, seed=seeds)
    assert batch.logprobs is None  # not asked for
    greedy = _gen(model)
    assert batch.tokens[0] == greedy.tokens[0]
    for i, prompt in enumerate(PROMPTS):
        alone = _gen(
            model, [prompt], speculative=spec, temperature=temps[i], top_k=tops[i], seed=seeds[i]
        )
        assert batch.tokens[i] == alone.tokens[0], i


def test_one_seed_means_consecutive_seeds(model):
    a = _gen(model, temperature=1.0, seed=40)
    b = _gen(model, temperature=1.0, seed=[40, 41, 42])
    assert a.tokens == b.tokens


def test_vectorised_keys_equal_seed_key():
    seeds = [0, 5, 2**31 + 3, 2**32 - 1]
    data = np.asarray(jax.random.key_data(seed_keys(seeds)))
    for row, s in zip(data, seeds, strict=True):
        assert row.tolist() == np.asarray(jax.random.key_data(seed_key(s))).tolist()
    mixed = np.asarray(jax.random.key_data(seed_keys([5, 2**40])))
    assert mixed[0].tolist() == data[1].tolist()


@pytest.mark.parametrize(
    "kw, err, match",
    [
        (dict(temperature=[1.0, 1.0]), ValueError, "temperature has 2 values but there are 3"),
        (dict(temperature=[1.0, -1.0, 1.0]), ValueError, r"temperature .*\(prompt 1\)"),
        (dict(min_p=1.5), ValueError, "min_p must be in"),
        (dict(min_p=[0.0, 0.0, -0.1]), ValueError, r"min_p .*\(prompt 2\)"),
        (dict(top_k=[1, 2.5, 3]), ValueError, "top_k"),
        (dict(seed=[1, 2]), ValueError, "seed has 2 values"),
        (dict(seed=[1, 2, "3"]), TypeError, "seed must be an int"),
        (dict(return_logprobs=1), TypeError, "return_logprobs must be a bool"),
        (dict(eos_id=[1, V]), ValueError, "outside the vocabulary"),
        (dict(eos_id=[1, 2.0]), ValueError, "eos_id must be"),
        (dict(eos_id="3"), ValueError, "eos_id must be"),
    ],
)
def test_bad_settings_are_refused_before_device_work(model, kw, err, match):
    with pytest.raises(err, match=match):
        _gen(model, **kw)


# ---- several EOS ids -----------------------------------------------------------------------------


@pytest.mark.parametrize("proposer", [None, "mtp", "ngram"])
def test_generation_stops_at_the_first_of_several_eos_ids(model, proposer):
    spec = None if proposer is None else mtpspec.SpecConfig(proposer=proposer, num_draft=3)
    free = _gen(model, new=24)
    seq = free.tokens[0]
    eos = [seq[9], seq[4]]  # the first occurrence of either ends the sequence
    cut = min(seq.index(e) for e in eos)
    got = _gen(model, speculative=spec, eos_id=eos, new=24)
    assert got.tokens[0] == seq[: cut + 1] and got.stop_reasons[0] == "eos"
    for i, row in enumerate(free.tokens[1:], start=1):  # every row, cut the same way
        hits = [j for j, t in enumerate(row) if t in eos]
        want = row[: hits[0] + 1] if hits else row
        assert got.tokens[i] == want
        assert got.stop_reasons[i] == ("eos" if hits else "length")
    assert _gen(model, speculative=spec, eos_id=np.asarray(eos), new=24).tokens == got.tokens


def test_a_first_token_in_the_eos_list_stops_at_once(model):
    first = _gen(model, new=1).tokens[0][0]
    got = _gen(model, eos_id=(V - 1, first), new=8)
    assert got.tokens[0] == [first] and got.stop_reasons[0] == "eos"


# ---- log-probabilities ---------------------------------------------------------------------------


@pytest.mark.parametrize("proposer", [None, "mtp", "ngram"])
def test_logprobs_are_the_models_own_log_softmax(model, proposer):
    """Oracle: a full forward over prompt + output; log softmax at each emitted position."""
    config, params = model
    spec = None if proposer is None else mtpspec.SpecConfig(proposer=proposer, num_draft=2)
    got = _gen(model, speculative=spec, return_logprobs=True, eos_id=None)
    assert got.logprobs is not None
    for prompt, toks, lps in zip(PROMPTS, got.tokens, got.logprobs, strict=True):
        assert len(lps) == len(toks)
        seq = jnp.asarray([prompt + toks])
        logp = jax.nn.log_softmax(models.forward(config, params, seq)[0], axis=-1)
        want = [float(logp[len(prompt) - 1 + j, t]) for j, t in enumerate(toks)]
        np.testing.assert_allclose(lps, want, atol=2e-4)


def test_logprobs_of_sampled_rows(model):
    got = _gen(model, temperature=1.5, seed=3, return_logprobs=True)
    assert all(lp <= 0.0 and np.isfinite(lp) for row in got.logprobs for lp in row)
    assert _gen(model, temperature=1.5, seed=3).tokens == got.tokens
