"""The C++ attention kernel (``mtpspec/kernels/cpu_attention.cc``): values against the XLA form
(``layers.cached_attention``), window invariance, the same bits from both instruction sets, only
the live prefix read (by each row of a window, whatever its lane neighbours see), use inside
loops, the rule that selects it, and decoding tokens with and without it."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import mtpspec
from mtpspec import config as C
from mtpspec import decoding, models
from mtpspec.kernels import cpu_attention, cpu_linear, settings
from mtpspec.kernels.settings import KernelSettings
from mtpspec.models import layers
from mtpspec.models.inference import AttentionCore, resolve_attention
from tests.conftest import users_jit
from tests.isa_testing import with_isa

built = pytest.mark.skipif(not cpu_attention.available(), reason=cpu_attention.status()[1])


def _inputs(seed, b, t, hq, g, d, n):
    rng = np.random.default_rng(seed)
    q = jnp.asarray(rng.standard_normal((b, t, hq, d)), jnp.float32)
    k = jnp.asarray(rng.standard_normal((b, g, n, d)), jnp.float32)
    v = jnp.asarray(rng.standard_normal((b, g, d, n)), jnp.float32)
    start = rng.integers(0, max(n - t, 0) + 1, size=b)
    pos = jnp.asarray(start[:, None] + np.arange(t)[None], jnp.int32)
    return q, k, v, pos


SHAPES = [  # b, t, hq, g, d, n: the default model's heads, GQA groups, odd widths, tiny caches
    (1, 1, 4, 1, 64, 291),
    (1, 3, 4, 1, 64, 291),
    (2, 5, 8, 2, 32, 40),
    (1, 16, 6, 3, 24, 17),
    (3, 2, 4, 4, 33, 9),
    (1, 1, 2, 1, 8, 1),
    (2, 4, 16, 2, 128, 70),
]


@built
@pytest.mark.parametrize("shape", SHAPES)
def test_kernel_equals_the_xla_form(shape):
    q, k, v, pos = _inputs(sum(shape), *shape)
    d = shape[4]
    want = layers.cached_attention(q, k, v, pos)
    got = users_jit(lambda *a: cpu_attention.apply(*a, d**-0.5))(q, k, v, pos)
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=2e-6)


@built
def test_a_window_equals_its_rows_one_at_a_time_bit_for_bit():
    q, k, v, pos = _inputs(1, 2, 6, 4, 2, 32, 50)
    window = cpu_attention.apply(q, k, v, pos, 0.2)
    for i in range(6):
        one = cpu_attention.apply(q[:, i : i + 1], k, v, pos[:, i : i + 1], 0.2)
        np.testing.assert_array_equal(one[:, 0], window[:, i])


@built
@pytest.mark.parametrize("t", [1, 4, 37])
def test_the_helper_thread_changes_no_bit(t):
    """Query rows are shared with a helper thread of XLA's pool in chunks: whichever thread runs a
    row, its arithmetic is the same."""
    q, k, v, pos = _inputs(10 + t, 2, t, 8, 2, 64, 300)
    got = []
    f = users_jit(lambda *a: cpu_attention.apply(*a, 0.125))
    for threads in (1, 2, 3):
        with settings.use(KernelSettings(attention_threads=threads)):
            assert f"threads = {threads} : i64" in f.lower(q, k, v, pos).as_text()
            got.append(np.asarray(f(q, k, v, pos)))
    for o in got[1:]:
        np.testing.assert_array_equal(o, got[0])


@built
@pytest.mark.parametrize(
    "shape",
    [(1, 1, 4, 1, 64, 291), (1, 4, 4, 1, 64, 291), (2, 5, 8, 2, 32, 40), (1, 37, 6, 3, 24, 60)],
)
def test_both_instruction_sets_give_the_same_bits(shape):
    """A kv head's query rows ride the vector lanes together (groups of 16 with AVX-512, 8 with
    AVX2, so the groups differ): every lane's arithmetic is a row's own, and the two instruction
    sets give identical bits — here 4, 16, 20 and 74 rows per kv head."""
    if not cpu_linear.has_avx512():
        pytest.skip("this CPU lacks AVX-512F")
    q, k, v, pos = _inputs(sum(shape), *shape)
    got = [
        with_isa(isa, lambda *a: cpu_attention.apply(*a, 0.125), q, k, v, pos)
        for isa in ("avx2", "avx512")
    ]
    np.testing.assert_array_equal(got[0], got[1])


@built
def test_an_isa_the_kernel_does_not_know_is_refused():
    q, k, v, pos = _inputs(0, 1, 1, 2, 1, 8, 4)
    call = jax.ffi.ffi_call(cpu_attention.TARGET, jax.ShapeDtypeStruct(q.shape, jnp.float32))
    with pytest.raises(Exception, match="isa must be 0"):
        call(q, k, v, pos, scale=np.float32(0.3), threads=np.int64(1), isa=np.int64(7))


@built
@pytest.mark.parametrize("bad", [np.nan, np.inf, -np.inf])
def test_what_later_rows_see_never_reaches_earlier_rows(bad):
    """In one window a row shares its vector group with rows that see more slots: NaN or ±inf in
    the slot only the last token's rows see leaves every other row's bits as when it runs alone
    on a clean cache (the slots a row may not see are masked, never multiplied by zero); the rows
    that see it come out NaN."""
    q, k, v, pos = _inputs(8, 1, 8, 4, 1, 32, 40)  # 32 rows: two 16-lane groups, or four of 8
    last = int(pos[0, -1])
    k_bad, v_bad = k.at[:, :, last].set(bad), v.at[:, :, :, last].set(bad)
    window = np.asarray(cpu_attention.apply(q, k_bad, v_bad, pos, 0.2))
    for i in range(7):
        one = cpu_attention.apply(q[:, i : i + 1], k, v, pos[:, i : i + 1], 0.2)
        np.testing.assert_array_equal(np.asarray(one)[:, 0], window[:, i])
    assert np.isnan(window[:, 7]).all()  # q . k over ±inf has terms of both signs: NaN


@built
def test_only_the_live_prefix_is_read():
    """Slots beyond each query's position (stale rows of a rewound cache) never matter: NaN there
    changes nothing."""
    q, k, v, pos = _inputs(2, 2, 3, 4, 1, 16, 64)
    clean = cpu_attention.apply(q, k, v, pos, 0.25)
    beyond = jnp.arange(64)[None, None, :] > pos[:, -1][:, None, None]  # [b, 1, n]
    k_bad = jnp.where(beyond[..., None], jnp.nan, k)
    v_bad = jnp.where(beyond[:, :, None, :], jnp.nan, v)
    poisoned = cpu_attention.apply(q, k_bad, v_bad, pos, 0.25)
    np.testing.assert_array_equal(poisoned, clean)


@built
def test_later_window_slots_and_positions_past_the_capacity():
    """A window's first row never reads the slots its later rows wrote (NaN there changes
    nothing), and a padded query past the capacity reads all of it, as XLA's form does."""
    q, k, v, pos = _inputs(6, 1, 4, 4, 2, 16, 12)
    first = cpu_attention.apply(q[:, :1], k, v, pos[:, :1], 0.25)
    later = jnp.arange(12)[None, None, :] > pos[:, 0][:, None, None]
    k_bad = jnp.where(later[..., None], jnp.nan, k)
    v_bad = jnp.where(later[:, :, None, :], jnp.nan, v)
    np.testing.assert_array_equal(
        cpu_attention.apply(q[:, :1], k_bad, v_bad, pos[:, :1], 0.25), first
    )
    past = jnp.full((1, 4), 40, jnp.int32)  # beyond the 12 slots
    want = layers.cached_attention(q, k, v, past)
    got = cpu_attention.apply(q, k, v, past, 16**-0.5)
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=2e-6)


@built
def test_nan_in_a_visible_key_comes_out_nan_as_in_xla():
    q, k, v, pos = _inputs(7, 1, 1, 2, 1, 8, 6)
    k = k.at[:, :, 0, 0].set(jnp.nan)  # slot 0 is visible to every query
    assert bool(jnp.all(jnp.isnan(cpu_attention.apply(q, k, v, pos, 0.3))))
    assert bool(jnp.all(jnp.isnan(layers.cached_attention(q, k, v, pos))))


@built
def test_kernel_runs_inside_jit_and_while_loop():
    q, k, v, pos = _inputs(3, 1, 2, 4, 2, 16, 12)

    def run(fn):
        body = lambda i, acc: acc + fn(q * (i + 1.0), k, v, pos)  # noqa: E731
        return users_jit(lambda: jax.lax.fori_loop(0, 4, body, jnp.zeros(q.shape)))()

    got = run(lambda *a: cpu_attention.apply(*a, 0.25))
    want = run(lambda q, k, v, p: layers.cached_attention(q * 0.25 / 16**-0.5, k, v, p))
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5)


@built
def test_no_gradient_through_the_kernel_says_so():
    q, k, v, pos = _inputs(4, 1, 1, 2, 1, 8, 4)
    with pytest.raises(ValueError, match="mtpspec_cpu_attention"):
        jax.grad(lambda q: jnp.sum(cpu_attention.apply(q, k, v, pos, 0.3)))(q)


def test_the_marker_selects_the_kernel_for_decoding_windows_only():
    ffi, xla = {"core": AttentionCore("ffi")}, {"core": AttentionCore("xla")}
    assert layers.native_attention(ffi, 1)
    assert layers.native_attention(ffi, cpu_attention.MAX_T)
    assert not layers.native_attention(ffi, cpu_attention.MAX_T + 1)  # a long prefill
    assert not layers.native_attention(xla, 1)
    assert not layers.native_attention({"w_o": jnp.zeros((4, 4))}, 1)  # canonical tree


def test_the_attention_option_beyond_linears_rules(monkeypatch):
    """The rules shared with ``linear`` are tested in test_cpu_linear.py (test_resolve_rules)."""
    assert resolve_attention("auto", cache_dtype="bfloat16") == "xla"  # would convert the cache
    monkeypatch.setattr(cpu_attention.KERNEL, "status", lambda: (False, "not built"))
    with pytest.raises(OSError, match="not built"):
        cpu_attention.apply(*_inputs(0, 1, 1, 2, 1, 4, 4), 0.5)


@pytest.fixture(scope="module")
def model():
    config = C.tiny_hybrid(
        vocab_size=64, layer_types=(C.LINEAR, C.FULL, C.LINEAR, C.FULL), mlp_types=("dense",) * 4
    )
    return config, models.init_params(config, jax.random.key(5), norm_scale=0.1)


@built
@pytest.mark.parametrize("proposer", [None, "ngram", "mtp"])
def test_decoding_tokens_with_either_attention(model, proposer):
    """The C++ attention and XLA's form emit the same tokens (plain: with the C++ linears and
    with XLA's dots; speculative: with the C++ linears); speculative decoding through the kernel
    emits plain greedy's tokens; each choice is its own compiled program."""
    config, params = model
    prompts = [[1, 2, 3, 4, 5, 6, 7, 1, 2, 3], [5, 3]]
    spec = None if proposer is None else decoding.SpecConfig(proposer, 3)
    plain = mtpspec.generate(config, params, prompts, max_new_tokens=24, attention="ffi")
    for linear in ("ffi", "xla") if proposer is None else ("ffi",):
        kw = dict(max_new_tokens=24, linear=linear, speculative=spec)
        native = mtpspec.generate(config, params, prompts, attention="ffi", **kw)
        assert native.tokens == plain.tokens, linear
        for attention in ("ffi", "xla"):  # the program holds the kernel exactly when asked
            prepared = decoding.prepare(config, params, prompts, attention=attention, **kw)
            text = prepared.lower().as_text()
            assert ("mtpspec_cpu_attention" in text) == (attention == "ffi"), (linear, attention)
        before = decoding.compile_count()
        xla = mtpspec.generate(config, params, prompts, attention="xla", **kw)
        assert decoding.compile_count() == before + 1  # not the ffi program from the cache
        assert xla.tokens == native.tokens, linear
    decoding.release_compiled()


@built
def test_a_long_prefill_through_the_kernels_equals_the_forward(model):
    """A prompt of several buckets (t = 100 > the old 16-token limit) prefilled as decoding runs
    it — the C++ attention and, at these heads, the C++ GDN kernel — gives the teacher-forced
    forward's logits on every real row; decoding picks the GDN kernel for it."""
    config, params = model
    tokens = jax.random.randint(jax.random.key(3), (2, 100), 0, config.vocab_size)
    lengths = jnp.array([100, 37], jnp.int32)
    prepared = decoding.prepare(config, params, tokens.tolist(), max_new_tokens=2)
    assert prepared.key.backend.prefill == "ffi"
    assert layers.native_attention({"core": AttentionCore("ffi")}, 100)
    tree = models.inference.MEMO.get(config, params, "ffi", "ffi")
    state = models.init_decode_state(config, 2, 128)
    got = models.decoder.window_step_impl(config, tree, state, tokens, lengths, "ffi")
    want = models.forward(config, params, tokens)
    for i, n in enumerate((100, 37)):
        np.testing.assert_allclose(got.logits[i, :n], want[i, :n], rtol=2e-4, atol=2e-4)


def _tree_visible(tree, lengths, n):
    """The slots each tree row reads (as ``models.tree.tree_attention`` builds them for XLA)."""
    rel = np.arange(n)[None, None, :] - np.asarray(lengths)[:, None, None]
    ok = np.asarray(tree.ancestor_mask)[None][
        np.zeros_like(rel), np.arange(tree.rows)[None, :, None], np.clip(rel, 0, tree.rows - 1)
    ]
    return jnp.asarray((rel < 0) | ((rel < tree.rows) & ok))


@built
@pytest.mark.parametrize("shape", [(2, 2), (3, 1, 2), (1, 1, 1)])
def test_tree_kernel_equals_the_masked_xla_form(shape):
    """Row r reads the committed prefix and its path's slots (L + ancestor): against
    ``layers.masked_cache_attention``; NaN in every slot no row may read (the siblings' and
    cousins' keys, stale slots past the window) changes nothing; any number of threads gives the
    same bits."""
    from mtpspec.models.tree import TreeShape

    tree = TreeShape(shape)
    b, hq, g, d, n = 2, 8, 2, 32, 48
    rng = np.random.default_rng(len(shape))
    q = jnp.asarray(rng.standard_normal((b, tree.rows, hq, d)), jnp.float32)
    k = jnp.asarray(rng.standard_normal((b, g, n, d)), jnp.float32)
    v = jnp.asarray(rng.standard_normal((b, g, d, n)), jnp.float32)
    lengths = jnp.asarray([5, 17], jnp.int32)
    visible = _tree_visible(tree, lengths, n)
    want = layers.masked_cache_attention(q, k, v, visible)
    got = cpu_attention.apply_tree(q, k, v, lengths, tree.ancestor_mask, d**-0.5)
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=2e-6)
    hidden = ~np.asarray(visible).any(axis=1)  # [b, n]: slots no row reads
    k_bad = jnp.where(jnp.asarray(hidden)[:, None, :, None], jnp.nan, k)
    v_bad = jnp.where(jnp.asarray(hidden)[:, None, None, :], jnp.nan, v)
    poisoned = cpu_attention.apply_tree(q, k_bad, v_bad, lengths, tree.ancestor_mask, d**-0.5)
    np.testing.assert_array_equal(poisoned, got)
    with settings.use(KernelSettings(attention_threads=1)):
        alone = users_jit(lambda *a: cpu_attention.apply_tree(*a, tree.ancestor_mask, d**-0.5))(
            q, k, v, lengths
        )
    np.testing.assert_array_equal(alone, got)
