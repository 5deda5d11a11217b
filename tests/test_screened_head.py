"""The screened greedy head (``greedy_head="screened"``): the LM head's argmax through its int8
screen equals, bit for bit, the argmax of the full head's logits — on random heads, exact ties,
near-ties one bf16 step apart and non-finite inputs, on both instruction sets — with a negative
control (the screen's own argmax differs); the screen saves most columns; decoding with it emits
the full head's tokens (plain, speculative, sampled, with log-probabilities) on the shipped model;
"auto" says what it chose; the errors."""

from __future__ import annotations

import json
import pathlib

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import mtpspec
from mtpspec import checkpoints, ops
from mtpspec import config as C
from mtpspec.decoding.draft_vocab import DraftVocab
from mtpspec.kernels import cpu_linear
from mtpspec.kernels import settings as kernel_settings
from mtpspec.kernels.settings import KernelSettings
from mtpspec.models import inference, init_params, linear
from mtpspec.models.linear import Linear
from mtpspec.tokenizers import ByteTokenizer
from tests.conftest import users_jit

ASSETS = pathlib.Path(__file__).resolve().parent.parent / "mtpspec" / "assets"
built = pytest.mark.skipif(not cpu_linear.available(), reason=cpu_linear.status()[1])
ISAS = ["avx2"] + (["avx512"] if cpu_linear.has_avx512() else [])
DTYPES = [jnp.float32, jnp.bfloat16]


def _full(x, wp, n):
    y = cpu_linear.apply(x, wp, n)
    ids = ops.argmax(y)
    return ids, jnp.take_along_axis(y, ids[:, None], axis=1)[:, 0], y


full_head = users_jit(_full, static_argnums=2)
screened = users_jit(cpu_linear.head_argmax, static_argnums=3)


def _check(x, w, dtype, group, isa="avx512"):
    """head_argmax against the full head's argmax and value on x, bit for bit; returns the
    columns computed exactly and the screen's own argmax."""
    n = w.shape[1]
    wp = cpu_linear.pack(w, dtype, group)
    sp = cpu_linear.screen(wp)
    with kernel_settings.use(KernelSettings(isa=isa)):
        ids, top, exact = screened(x, wp, sp, n)
        want_ids, want_top, _ = full_head(x, wp, n)
        own = ops.argmax(cpu_linear.apply(x, sp, n))  # the screen alone
    np.testing.assert_array_equal(np.asarray(ids), np.asarray(want_ids))
    np.testing.assert_array_equal(np.asarray(top), np.asarray(want_top))
    return np.asarray(exact), np.asarray(own)


@built
@pytest.mark.parametrize("isa", ISAS)
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize(
    "rows, d_in, d_out, group",
    # a decode step, a window, a partial last tile and group, a widened window (>= 12 rows)
    [(1, 64, 3000, 128), (4, 96, 1000, 64), (13, 40, 517, 128)],
)
def test_the_screened_argmax_is_the_full_heads(isa, dtype, rows, d_in, d_out, group):
    rng = np.random.default_rng(rows + d_in)
    w = rng.standard_normal((d_in, d_out)) * np.exp(rng.uniform(-2, 2, d_out)) * 0.02
    x = rng.standard_normal((rows, d_in)).astype(np.float32)
    exact, _ = _check(x, w.astype(np.float32), dtype, group, isa)
    assert np.all(exact >= 1) and np.all(exact <= d_out)


@built
@pytest.mark.parametrize("dtype", DTYPES)
def test_ties_and_near_ties_go_to_the_first_largest_and_the_screen_alone_would_not(dtype):
    """Copies of one column (exact ties: the first wins) and columns one bf16 step apart from it
    (near-ties far below the int8 screen's resolution): the screened argmax is the full head's
    on every row, where the screen's own argmax (the negative control) is not."""
    rng = np.random.default_rng(7)
    d_in, d_out, rows = 128, 2000, 24
    w = (rng.standard_normal((d_in, d_out)) * 0.02).astype(np.float32)
    base = w[:, 5].copy()
    for j in (1500, 700, 1999):  # ties, in different groups, after and before column 5's group
        w[:, j] = base
    base = np.asarray(jnp.asarray(base, jnp.bfloat16).astype(jnp.float32))
    for j in range(900, 960):  # near-ties: one input nudged by a bf16 step up or down
        w[:, j] = base
        i = j % d_in
        v = jnp.asarray(base[i], jnp.bfloat16)
        w[i, j] = np.float32(jnp.nextafter(v, jnp.asarray(np.inf if j % 2 else -np.inf, v.dtype)))
    w = np.asarray(jnp.asarray(w).astype(dtype).astype(jnp.float32))
    x = (rng.standard_normal((rows, d_in)) * 0.01).astype(np.float32)
    x += 3.0 * np.sign(base)[None, :] * (rng.random((rows, d_in)) < 0.5)  # column 5's group wins
    exact, own = _check(x, w, dtype, 128)
    want = np.asarray(full_head(x, cpu_linear.pack(w, dtype, 128), d_out)[0])
    assert np.any(own != want), "the negative control: the int8 screen alone picks other ids"
    assert np.all(exact < d_out)  # and still the screen ruled out most groups


@built
def test_the_screen_saves_most_of_a_large_head():
    """A 50k-column head at a real model's input width, random (near-flat logits: the screen's
    hardest case): the columns computed exactly are a few tens of its 391 groups (the rest is
    the int8 stream)."""
    rng = np.random.default_rng(3)
    d_in, d_out = 1024, 50_000
    w = (rng.standard_normal((d_in, d_out)) * 0.02).astype(np.float32)
    x = rng.standard_normal((3, d_in)).astype(np.float32)
    exact, _ = _check(x, w, jnp.bfloat16, 128)
    assert np.all(exact <= 0.15 * d_out), exact


@built
def test_non_finite_rows_get_the_full_heads_answer():
    """A NaN input (every logit NaN: the first), an infinite one and huge values that overflow
    (the row is computed whole, as the full head would)."""
    rng = np.random.default_rng(5)
    w = (rng.standard_normal((32, 700)) * 0.1).astype(np.float32)
    x = rng.standard_normal((4, 32)).astype(np.float32)
    x[0, 3] = np.nan
    x[1, 0] = np.inf
    x[2] = np.where(x[2] > 0, 3e38, -3e38)
    _check(x, w, jnp.float32, 128)
    w[:, 40:200] = 0.0  # zero columns (a bound of 0: never candidates unless they win)
    w[:, 300] = 1e-40  # a column of denormals (whatever DAZ says, its bound holds)
    exact, _ = _check(rng.standard_normal((3, 32)).astype(np.float32), w, jnp.float32, 128)
    assert np.all(exact < 700)


@built
def _screen_oracle(w: np.ndarray, group: int) -> np.ndarray:
    """The screen's bytes in NumPy float32 (IEEE division), packed as the kernel reads them."""
    amax = np.abs(w).max(axis=0)
    tiny = np.finfo(np.float32).tiny
    scale = np.where(amax > 0, np.maximum(amax * np.float32(1 / 127), tiny), 0).astype(np.float32)
    q = np.clip(np.rint(w / np.where(scale > 0, scale, 1)), -127, 127).astype(np.int8)
    d_in, d_out = w.shape
    groups = -(-d_out // group)
    pad = groups * group - d_out
    q = np.pad(q, ((0, 0), (0, pad))).reshape(d_in, groups, group).transpose(1, 0, 2)
    raw = np.pad(scale, (0, pad)).view(np.int8).reshape(groups, group, 4)
    return np.concatenate([q, raw.transpose(0, 2, 1)], axis=1)


@built
def test_the_screen_is_its_quantisation_and_no_inputs_give_column_zero():
    rng = np.random.default_rng(2)
    w = (rng.standard_normal((48, 300)) * 0.1).astype(np.float32)
    w[:, 7] = 0.0
    for dtype in DTYPES:
        wd = np.asarray(jnp.asarray(w).astype(dtype).astype(jnp.float32))
        for group in cpu_linear.GROUPS:
            got = np.asarray(cpu_linear.screen(cpu_linear.pack(w, dtype, group)))
            np.testing.assert_array_equal(got, _screen_oracle(wd, group))
    wp = cpu_linear.pack(np.zeros((0, 20), np.float32), jnp.float32, 128)
    ids, top, _ = screened(np.ones((2, 0), np.float32), wp, cpu_linear.screen(wp), 20)
    np.testing.assert_array_equal(np.asarray(ids), [0, 0])
    np.testing.assert_array_equal(np.asarray(top), [0.0, 0.0])


@pytest.fixture(scope="module")
def shipped():
    config, params = checkpoints.restore_params(ASSETS / "default_model")
    full = inference.decoding_weights(config, params, linear="ffi", greedy_head="full")
    scr = inference.decoding_weights(config, params, linear="ffi", greedy_head="screened")
    return config, full, scr


def _demo_prompts(n=2):
    texts = json.loads((ASSETS / "demo_prompts.json").read_text())["prompts"][:n]
    return [ByteTokenizer().encode(t["text"]) for t in texts]


@built
def test_decoding_through_the_screen_emits_the_full_heads_tokens(shipped):
    """The shipped model (a trained head: its text, not a random model's repeats), its head
    screened: plain greedy, MTP chains (scan and replay commits), an adaptive chain, a tree and
    a draft vocabulary emit the full head's greedy tokens (greedy chains with the same
    acceptance: the same drafts); log-probabilities and sampling take the full logits and match
    too."""
    config, full, scr = shipped
    assert scr.greedy_head == "screened" and full.greedy_head == "full"
    assert scr["lm_head"].w is scr["embed"].w  # the head is still the embedding, stored once
    prompts = _demo_prompts()
    plain = mtpspec.generate(config, full, prompts, max_new_tokens=32).tokens
    assert len(set(plain[0])) > 5  # real text
    assert mtpspec.generate(config, scr, prompts, max_new_tokens=32).tokens == plain
    vocab = DraftVocab(np.arange(128), vocab_size=config.vocab_size, source="test")
    for spec in (
        mtpspec.SpecConfig(num_draft=1),
        mtpspec.SpecConfig(num_draft=3, p_min=0.5),
        mtpspec.SpecConfig(num_draft=2, tree=(2, 1)),
    ):
        got = mtpspec.generate(config, scr, prompts, max_new_tokens=32, speculative=spec)
        assert got.tokens == plain, spec
    for spec in (  # greedy chains draft through the screen too: the same drafts, the same τ
        mtpspec.SpecConfig(num_draft=3, commit="replay"),
        mtpspec.SpecConfig(num_draft=2, draft_vocab=vocab),
    ):
        a = mtpspec.generate(config, full, prompts, max_new_tokens=32, speculative=spec)
        b = mtpspec.generate(config, scr, prompts, max_new_tokens=32, speculative=spec)
        assert b.tokens == plain, spec
        assert a.stats["position_acceptance"] == b.stats["position_acceptance"], spec
        assert a.stats["tau"] == b.stats["tau"] > 1.5
    a = mtpspec.generate(config, full, prompts, max_new_tokens=16, return_logprobs=True)
    b = mtpspec.generate(config, scr, prompts, max_new_tokens=16, return_logprobs=True)
    assert a.tokens == b.tokens and a.logprobs == b.logprobs
    opts = dict(max_new_tokens=16, temperature=0.8, seed=3)
    assert (
        mtpspec.generate(config, full, prompts, **opts).tokens
        == mtpspec.generate(config, scr, prompts, **opts).tokens
    )


@built
def test_auto_screens_a_large_vocabulary_on_the_cpu_linear_and_says_so():
    small = C.tiny_hybrid(vocab_size=64)
    big = C.tiny_hybrid(vocab_size=linear.SCREEN_MIN_VOCAB)
    assert linear.resolve_greedy_head("auto", small, "ffi") == "full"
    assert linear.resolve_greedy_head("auto", big, "ffi") == "screened"
    assert linear.resolve_greedy_head("auto", big, "xla") == "full"
    assert linear.resolve_greedy_head("auto", big, "ffi", "int8") == "full"
    params = init_params(big, jax.random.key(0))
    made = inference.decoding_weights(big, params, linear="ffi")
    assert made.greedy_head == "screened" and "greedy_head='screened'" in repr(made)
    assert made["lm_head"].screen.dtype == jnp.int8
    assert inference.decoding_weights(big, params, linear="xla").greedy_head == "full"


@built
def test_errors_name_the_problem(tmp_path):
    config = C.tiny_hybrid(vocab_size=64)
    params = init_params(config, jax.random.key(0))
    with pytest.raises(ValueError, match="greedy_head must be one of"):
        inference.decoding_weights(config, params, greedy_head="fast")
    with pytest.raises(ValueError, match="linear resolved to 'xla'"):
        inference.decoding_weights(config, params, linear="xla", greedy_head="screened")
    with pytest.raises(ValueError, match="the matrices are int8"):
        inference.decoding_weights(config, params, weights="int8", greedy_head="screened")
    with pytest.raises(ValueError, match="greedy_head must be one of"):  # before any read
        checkpoints.load(tmp_path / "nothing", for_decoding=True, greedy_head="fast")
    with pytest.raises(ValueError, match="pass for_decoding=True"):
        checkpoints.load(tmp_path / "nothing", greedy_head="screened")
    with pytest.raises(ValueError, match="the matrices are int8"):
        checkpoints.load(
            tmp_path / "nothing", for_decoding=True, weights="int8", greedy_head="screened"
        )
    plain = Linear.of(np.ones((8, 8), np.float32), "ffi")
    with pytest.raises(ValueError, match="has no screen"):
        plain.argmax(jnp.ones((1, 8)))
    with pytest.raises(ValueError, match="needs a float32 or bf16 weight packed"):
        Linear.of(np.ones((8, 8), np.float32), "ffi", quant="int8").with_screen()
    with pytest.raises(ValueError, match="needs a float32 or bf16 weight packed"):
        Linear.of(np.ones((8, 8), np.float32), "xla").with_screen()
    wp = cpu_linear.pack(np.ones((8, 8), np.float32), jnp.float32, 128)
    with pytest.raises(ValueError, match="does not belong to a weight"):
        cpu_linear.head_argmax(jnp.ones((1, 8)), wp, cpu_linear.screen(wp)[:, :-1], 8)
    with pytest.raises(ValueError, match="float32 or bf16 packed weight and its int8 screen"):
        cpu_linear.head_argmax(jnp.ones((1, 8)), wp, wp, 8)


@built
def test_drafts_take_the_screen_only_where_they_need_nothing_but_the_argmax(shipped):
    """``proposers.base.argmax_head``: a greedy chain (fixed k) drafts through the screen; a
    tree (top-b children), an adaptive chain (confidences) and sampling (q) take logits; a
    draft vocabulary's head keeps its columns' screen (``Linear.subset``)."""
    from mtpspec.decoding.proposers.base import argmax_head
    from mtpspec.decoding.sampling import Sampling
    from mtpspec.models.tree import TreeShape

    config, full, scr = shipped
    head = scr["lm_head"]

    class Key:  # the program key's fields argmax_head reads
        def __init__(self, greedy=True, adaptive=False):
            self.sampling, self.adaptive = Sampling(greedy=greedy), adaptive

    chain, tree = TreeShape.chain(3), TreeShape((2, 1))
    assert argmax_head(Key(), chain, head) is not None
    assert argmax_head(Key(), tree, head) is None
    assert argmax_head(Key(adaptive=True), chain, head) is None
    assert argmax_head(Key(greedy=False), chain, head) is None
    assert argmax_head(Key(), chain, full["lm_head"]) is None  # no screen
    ids = jnp.asarray([3, 200, 17, 64, 255], jnp.int32)
    sub = head.subset(ids)
    want = cpu_linear.pack_raw_rows(cpu_linear.packed_columns(head.screen, ids), 128)
    np.testing.assert_array_equal(np.asarray(sub.screen), np.asarray(want))
    x = jnp.asarray(np.random.default_rng(0).standard_normal((3, config.hidden_size)), jnp.float32)
    np.testing.assert_array_equal(
        np.asarray(jax.jit(sub.argmax)(x)), np.asarray(ops.argmax(jax.jit(sub.__call__)(x)))
    )


@built
def test_the_window_cost_tools_time_what_decoding_runs_with_a_screened_head():
    """A large vocabulary screens its head by default; ``tree_plan``'s window costs then time
    the windows as decoding runs them (ids, no logits) instead of failing on them."""
    from mtpspec.analysis.trees import tree_costs

    dense = {**C.TWO_LAYERS, "mlp_types": ("dense", "dense")}
    config = C.tiny_hybrid(vocab_size=linear.SCREEN_MIN_VOCAB, **dense)
    params = init_params(config, jax.random.key(1), norm_scale=0.1)
    made = inference.decoding_weights(config, params)
    assert made.greedy_head == "screened"
    got = tree_costs(config, made, [1, 2, 3], [(2, 1)], iters=2)
    assert got["tree"][(2, 1)] > 0
