"""The C++ CPU linear (``mtpspec/kernels``) and the inference tree that uses it
(``models/inference.py``): every product against numpy's float64 one, fused and packed trees
against the canonical one, every implementation's tokens against the others'."""

from __future__ import annotations

import shutil

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import mtpspec
from mtpspec import config as C
from mtpspec import decoding, models
from mtpspec.kernels import cpu_attention, cpu_linear
from mtpspec.kernels import settings as kernel_settings
from mtpspec.kernels.settings import KernelSettings
from mtpspec.models import decoder
from mtpspec.models.inference import (
    MEMO,
    Linear,
    inference_params,
    resolve_attention,
    resolve_linear,
)
from tests.conftest import USERS_LEVEL, users_jit

COMPILER = shutil.which("c++") or shutil.which("g++")
built = pytest.mark.skipif(not cpu_linear.available(), reason=cpu_linear.status()[1])
# the kernel's inner loops this CPU runs (AVX-512 only where it has it)
ISAS = ["avx2"] + (["avx512"] if cpu_linear.has_avx512() else [])


def test_the_kernel_is_built_wherever_a_compiler_is():
    """`make install` builds the kernel on any machine with a C++ compiler (CI included)."""
    if COMPILER is None:
        pytest.skip("no C++ compiler here: the kernel is optional")
    ok, why = cpu_linear.status()
    assert ok, why


def _check(rows, d_in, d_out, seed=0, scale=1.0, isa="auto"):
    with kernel_settings.use(KernelSettings(isa=isa)):
        _check_isa(rows, d_in, d_out, seed, scale)


def _check_isa(rows, d_in, d_out, seed, scale):
    rng = np.random.default_rng(seed)
    x = (rng.standard_normal((rows, d_in)) * scale).astype(np.float32)
    w = rng.standard_normal((d_in, d_out)).astype(np.float32)
    y = np.asarray(users_jit(cpu_linear.apply, static_argnums=2)(x, cpu_linear.pack(w), d_out))
    ref = x.astype(np.float64) @ w.astype(np.float64)
    bound = 1e-5 * (np.abs(x).astype(np.float64) @ np.abs(w).astype(np.float64)) + 1e-6
    assert y.shape == (rows, d_out) and y.dtype == np.float32
    assert (np.abs(y - ref) <= bound).all(), np.abs(y - ref).max()


@built
@pytest.mark.parametrize("isa", ISAS)
@pytest.mark.parametrize("rows", [1, 2, 3, 4, 5, 6, 7, 8, 13, 64, 121, 256])
@pytest.mark.parametrize("d_in, d_out", [(128, 768), (384, 128), (1, 1), (7, 5), (33, 17)])
def test_kernel_matches_float64_product(rows, d_in, d_out, isa):
    _check(rows, d_in, d_out, isa=isa)


@built
@settings(max_examples=40, deadline=None)
@given(
    rows=st.integers(1, 14),
    d_in=st.integers(1, 300),
    d_out=st.integers(1, 300),
    seed=st.integers(0, 2**16),
    isa=st.sampled_from(ISAS),
)
def test_kernel_fuzzed_shapes(rows, d_in, d_out, seed, isa):
    """Off-tile widths (an odd tile count leaves AVX-512 one tile without a pair), odd input
    counts, every row-block remainder (rows mod 6)."""
    _check(rows, d_in, d_out, seed, isa=isa)


@built
@pytest.mark.parametrize("rows", [1, 3, 4, 6, 7])
def test_avx512_tile_sets_change_no_value(rows):
    """AVX-512 takes up to 8 full tiles side by side (a packed group's row): a column's value is
    the same whatever tiles its own was taken with (8, 4, 2 or alone, in the first or a later
    group, or the partial last tile), so how the threads' chunks split tiles is moot."""
    if "avx512" not in ISAS:
        pytest.skip("this CPU lacks AVX-512F")
    rng = np.random.default_rng(rows)
    x = rng.standard_normal((rows, 70)).astype(np.float32)
    w = rng.standard_normal((70, 300)).astype(np.float32)  # 2 groups, then 2 tiles + 12 columns
    f = users_jit(cpu_linear.apply, static_argnums=2)
    with kernel_settings.use(KernelSettings(isa="avx512")):
        together = np.asarray(f(x, cpu_linear.pack(w), 300))
        for t in range(19):
            cols = slice(16 * t, min(16 * t + 16, 300))
            alone = np.asarray(f(x, cpu_linear.pack(w[:, cols]), cols.stop - cols.start))
            np.testing.assert_array_equal(together[:, cols], alone)


@built
@pytest.mark.parametrize("group", [64, 128])
@pytest.mark.parametrize("storage", ["float32", "bfloat16"])
@pytest.mark.parametrize("d_in", [70, 301])
def test_a_rows_result_does_not_depend_on_its_window(storage, d_in, group):
    """Each output is summed in one order whatever the row count it is called with (issue 35):
    row r of an R-row call (a verify window, a prefill) equals the same row called alone (a
    decode step) bit for bit, on every instruction set, and both instruction sets agree. 301
    inputs take several input chunks and leave a remainder; 300 outputs are 19 tiles, the last
    partial, in packed rows of 8 or 4 tiles (both row widths, each against the other). 9-11
    rows end in a block of 3-5 (unwidened bf16: the 3-row block of 8 tiles and the 4-5-row
    blocks of 4); 260 rows are a 252-row block (widened) and 8 rows left over (too few to
    widen), 264 a second widened block. Negative control: the same products summed in another
    order differ, so bit equality is a real check."""
    rng = np.random.default_rng(d_in)
    x = rng.standard_normal((264, d_in)).astype(np.float32)
    w = rng.standard_normal((d_in, 300)).astype(np.float32)
    wp = cpu_linear.pack(jnp.asarray(w, storage), jnp.dtype(storage), group)
    f = users_jit(cpu_linear.apply, static_argnums=2)
    by_isa = []
    for isa in ISAS:  # one jitted f: JAX's caches key on the settings, so each ISA is traced
        with kernel_settings.use(KernelSettings(isa=isa)):
            assert f"isa = {cpu_linear.isa_code(isa)} : i64" in f.lower(x, wp, 300).as_text()
            alone = np.concatenate([np.asarray(f(x[i : i + 1], wp, 300)) for i in range(len(x))])
            for rows in (2, 3, 4, 5, 6, 7, 9, 10, 11, 13, 64, 131, 260, 264):
                np.testing.assert_array_equal(np.asarray(f(x[:rows], wp, 300)), alone[:rows])
        by_isa.append(alone)
    for other in by_isa[1:]:
        np.testing.assert_array_equal(other, by_isa[0])
    # and the other packed row width gives the same bits (4 or 8 tiles a row: only the speed)
    wide = cpu_linear.pack(jnp.asarray(w, storage), jnp.dtype(storage), 192 - group)
    np.testing.assert_array_equal(np.asarray(f(x, wide, 300)), by_isa[0])
    perm = rng.permutation(d_in)
    w_perm = jnp.asarray(w[perm], storage)
    reordered = np.asarray(f(x[:, perm], cpu_linear.pack(w_perm, jnp.dtype(storage), group), 300))
    assert not np.array_equal(reordered, by_isa[0])
    np.testing.assert_allclose(reordered, by_isa[0], rtol=1e-4, atol=1e-4)


def test_bad_or_unsupported_isa_raises(monkeypatch):
    with pytest.raises(ValueError, match="isa 'sse2'"):
        cpu_linear.isa_code("sse2")
    with pytest.raises(ValueError, match="isa 'sse2'"):
        KernelSettings(isa="sse2")
    monkeypatch.setattr(kernel_settings, "has_avx512", lambda: False)
    with pytest.raises(OSError, match="AVX-512F"):
        cpu_linear.isa_code("avx512")
    with pytest.raises(OSError, match="AVX-512F"), kernel_settings.use(KernelSettings("avx512")):
        pass
    assert cpu_linear.isa_name("auto") == "avx2"
    assert KernelSettings().resolved().isa == "avx2"


@built
def test_kernel_inside_a_while_loop_matches_xla():
    rng = np.random.default_rng(1)
    w = jnp.asarray(rng.standard_normal((48, 48)).astype(np.float32) / 7)
    wp = cpu_linear.pack(w)
    x0 = jnp.asarray(rng.standard_normal((3, 48)).astype(np.float32))

    def run(use_ffi):
        def body(i, x):
            y = cpu_linear.apply(x, wp, 48) if use_ffi else jnp.dot(x, w, precision="highest")
            return jnp.tanh(y)

        return users_jit(lambda x: jax.lax.fori_loop(0, 20, body, x))(x0)

    np.testing.assert_allclose(run(True), run(False), rtol=1e-5, atol=1e-6)


def test_pack_round_trips():
    w = jnp.asarray(np.random.default_rng(2).standard_normal((9, 300)).astype(np.float32))
    wp = cpu_linear.pack(w, group=128)
    assert wp.shape == cpu_linear.packed_shape(9, 300, 128) == (3, 9, 128)
    assert (cpu_linear.unpack(wp, 300) == w).all()
    assert (np.asarray(wp)[1, :, 5] == np.asarray(w)[:, 133]).all()  # group 1 is columns 128..255
    assert (np.asarray(wp)[2, :, 44:] == 0).all()  # the padding past column 300
    assert (cpu_linear.unpack(cpu_linear.pack_rows(w.T, group=128), 300) == w).all()
    narrow = cpu_linear.pack(w, group=64)
    assert narrow.shape == cpu_linear.packed_shape(9, 300, 64) == (5, 9, 64)
    assert (np.asarray(narrow)[2, :, 5] == np.asarray(w)[:, 133]).all()  # columns 128..191
    assert (cpu_linear.unpack(narrow, 300) == w).all()
    assert (cpu_linear.unpack(cpu_linear.pack_rows(w.T, group=64), 300) == w).all()
    ids = jnp.asarray([0, 63, 64, 133, 299])
    for wp_ in (wp, narrow):
        assert (cpu_linear.packed_columns(wp_, ids) == w.T[ids]).all()
    # the default follows the instruction set in effect: 8 tiles a row on AVX-512, 4 on AVX2
    with kernel_settings.use(KernelSettings(isa="avx2")):
        assert cpu_linear.group_width() == 64 and cpu_linear.pack(w).shape[2] == 64
    if "avx512" in ISAS:
        with kernel_settings.use(KernelSettings(isa="avx512")):
            assert cpu_linear.group_width() == 128 and cpu_linear.pack(w).shape[2] == 128
    with pytest.raises(ValueError, match="64 or 128 columns wide, not 32"):
        cpu_linear.pack(w, group=32)


@pytest.mark.parametrize("impl", ["xla", pytest.param("ffi", marks=built)])
def test_an_input_split_in_heads_goes_in_as_is(impl):
    """``Linear(x, heads=True)`` with x [..., h, d], h · d = in, is the flat product bit for bit
    (the kernel takes the heads unflattened); heads that do not make the width are refused."""
    rng = np.random.default_rng(4)
    w = jnp.asarray(rng.standard_normal((96, 40)), jnp.float32)
    x = jnp.asarray(rng.standard_normal((2, 3, 4, 24)), jnp.float32)
    lin = Linear.of(w, impl)
    flat = users_jit(lambda x: lin(x.reshape(2, 3, 96)))(x)
    heads = users_jit(lambda x: lin(x, heads=True))(x)
    assert heads.shape == (2, 3, 40)
    np.testing.assert_array_equal(heads, flat)
    with pytest.raises(ValueError, match="input width 96"):
        lin(x[..., :20], heads=True)


# ---- choosing an implementation ------------------------------------------------------------------


# linear and attention are resolved by the same rules (models/inference._resolve), each against
# its own kernel
RESOLVERS = [
    ("linear", resolve_linear, cpu_linear),
    ("attention", resolve_attention, cpu_attention),
]


@pytest.mark.parametrize("what, resolve, kernel", RESOLVERS, ids=[r[0] for r in RESOLVERS])
def test_resolve_rules(what, resolve, kernel):
    with pytest.raises(ValueError, match=f"unknown {what} implementation"):
        resolve("fast")
    with pytest.raises(ValueError, match="device mesh"):
        resolve("ffi", sharded=True)
    with pytest.raises(ValueError, match="CPU kernel"):
        resolve("ffi", platform="gpu")
    assert resolve("auto", sharded=True) == "xla"
    assert resolve("auto", platform="gpu") == "xla"
    assert resolve("xla") == "xla"
    assert resolve("auto") == ("ffi" if kernel.available() else "xla")


@pytest.mark.parametrize("what, resolve, kernel", RESOLVERS, ids=[r[0] for r in RESOLVERS])
def test_explicit_ffi_without_the_kernel_raises(monkeypatch, what, resolve, kernel):
    monkeypatch.setattr(kernel.KERNEL, "status", lambda: (False, "it is not built (test)"))
    with pytest.raises(OSError, match="not built"):
        resolve("ffi")
    assert resolve("auto") == "xla"


# ---- the inference tree --------------------------------------------------------------------------


@pytest.fixture(scope="module", params=["moe_untied", "dense_tied"])
def model(request):
    """MoE with a shared expert and an untied head; dense MLPs with the head tied to the embedding
    (the inference tree then holds the transposed embedding as its LM head)."""
    if request.param == "moe_untied":
        config = C.tiny_moe(vocab_size=64, **C.TWO_LAYERS)
    else:
        config = C.tiny_hybrid(
            vocab_size=64, layer_types=(C.LINEAR, C.FULL), mlp_types=("dense",) * 2
        )
    return config, models.init_params(config, jax.random.key(5), norm_scale=0.1)


IMPLS = ["xla", pytest.param("ffi", marks=built)]


@pytest.mark.parametrize("impl", IMPLS)
def test_inference_tree_gives_the_canonical_logits(model, impl):
    config, params = model
    before = jax.tree.map(np.asarray, params)
    tree = inference_params(config, params, impl)
    tokens = jnp.asarray(np.random.default_rng(3).integers(0, 64, (2, 12)), jnp.int32)
    ref = decoder.forward(config, params, tokens)
    got = decoder.forward(config, tree, tokens)
    np.testing.assert_allclose(got, ref, rtol=2e-5, atol=2e-5)
    # cached: a prefill then a 3-token window, as the verify step runs it
    out_ref = decoder.prefill(config, params, tokens[:, :9], capacity=32)
    out = decoder.prefill(config, tree, tokens[:, :9], capacity=32)
    w_ref = decoder.window_step(config, params, out_ref.state, tokens[:, 9:])
    w = decoder.window_step(config, tree, out.state, tokens[:, 9:])
    np.testing.assert_allclose(w.logits, w_ref.logits, rtol=2e-5, atol=2e-5)
    np.testing.assert_allclose(w.logits, ref[:, 9:], rtol=5e-5, atol=5e-5)
    # the canonical tree is left as it was
    jax.tree.map(np.testing.assert_array_equal, jax.tree.map(np.asarray, params), before)
    fused = [x for x in jax.tree.leaves(tree, is_leaf=lambda x: isinstance(x, Linear))]
    assert any(isinstance(x, Linear) and len(x.splits) > 1 for x in fused)


@built
@pytest.mark.parametrize("rows", [1, 4, 7, 130])
def test_prefetch_and_threads_change_no_value(rows):
    """The software prefetch is a hint and the helper thread takes whole tiles: neither may
    change a bit of the result."""
    rng = np.random.default_rng(rows)
    x = rng.standard_normal((rows, 96)).astype(np.float32)
    wp = cpu_linear.pack(rng.standard_normal((96, 200)).astype(np.float32))
    f = users_jit(lambda a, b: cpu_linear.apply(a, b, 200))  # retraced per setting (JAX's caches)
    for isa in ISAS:
        got = []
        for prefetch, threads in ((0, 1), (64, 1), (64, 2), (8, 2)):
            with kernel_settings.use(
                KernelSettings(isa, linear_threads=threads, prefetch=prefetch)
            ):
                assert f"prefetch = {prefetch} : i64" in f.lower(x, wp).as_text()
                got.append(np.asarray(f(x, wp)))
        for y in got[1:]:
            np.testing.assert_array_equal(y, got[0])


def test_inference_trees_are_memoized_by_leaf_identity(model):
    config, params = model
    a = MEMO.get(config, params, "xla")
    assert MEMO.get(config, params, "xla") is a
    changed = dict(params, final_norm=params["final_norm"] + 1.0)
    assert MEMO.get(config, changed, "xla") is not a
    mutable = jax.tree.map(np.asarray, params)  # numpy leaves can change in place: never cached
    assert MEMO.get(config, mutable, "xla") is not MEMO.get(config, mutable, "xla")


def test_every_linear_emits_the_same_tokens(model):
    """Plain and n-gram k = 3 (a 4-row window; the kernel's row counts 1..8 are checked above)."""
    config, params = model
    k = 3
    prompts = [[1, 2, 3, 4, 5, 6, 7, 1, 2, 3], [5, 3]]
    impls = ["xla", "ffi"] if cpu_linear.available() else ["xla"]
    plain = {
        i: mtpspec.generate(config, params, prompts, max_new_tokens=20, linear=i) for i in impls
    }
    spec = decoding.SpecConfig("ngram", k)
    for i in impls:
        assert plain[i].tokens == plain["xla"].tokens
        got = mtpspec.generate(
            config, params, prompts, max_new_tokens=20, speculative=spec, linear=i
        )
        assert got.tokens == plain[i].tokens


def test_bad_linear_argument_raises_before_device_work(model):
    config, params = model
    with pytest.raises(ValueError, match="unknown linear implementation"):
        mtpspec.generate(config, params, [[1, 2]], max_new_tokens=4, linear="blas")


def test_explicit_ffi_under_a_mesh_is_refused_and_auto_runs_xla(model):
    from mtpspec import sharding

    config, params = model
    mesh = sharding.make_mesh(data=1, model=1)
    with pytest.raises(ValueError, match="device mesh"):
        mtpspec.generate(config, params, [[1, 2]], max_new_tokens=4, mesh=mesh, linear="ffi")
    prepared = decoding.prepare(config, params, [[1, 2]], max_new_tokens=4, mesh=mesh)
    assert prepared.key.backend.linear == "xla"
    assert not any(
        isinstance(x, Linear)
        for x in jax.tree.leaves(prepared.args[0], is_leaf=lambda x: isinstance(x, Linear))
    )


@built
@pytest.mark.parametrize("isa", ISAS)
@pytest.mark.parametrize("rows", [1, 2, 3, 4, 5, 6, 7, 13, 64, 131])
@pytest.mark.parametrize("d_in, d_out", [(128, 768), (33, 17), (70, 48), (1, 1)])
def test_bf16_weights_equal_the_float32_kernel_on_the_widened_weights(rows, d_in, d_out, isa):
    """bf16 packing halves the bytes and changes no value: bit for bit the f32 kernel's result on
    the same weights widened (the widening is exact, the accumulation order the same)."""
    with kernel_settings.use(KernelSettings(isa=isa)):
        rng = np.random.default_rng(rows * 7 + d_in)
        x = rng.standard_normal((rows, d_in)).astype(np.float32)
        w = jnp.asarray(rng.standard_normal((d_in, d_out)), jnp.bfloat16)
        f = users_jit(cpu_linear.apply, static_argnums=2)
        wp = cpu_linear.pack(w, jnp.bfloat16)
        assert cpu_linear.stored_dtype(wp) == jnp.bfloat16 and wp.dtype == jnp.uint16
        assert wp.shape == cpu_linear.packed_shape(d_in, d_out)
        assert (cpu_linear.unpack(wp, d_out) == w).all()
        got = np.asarray(f(x, wp, d_out))
        want = np.asarray(f(x, cpu_linear.pack(w.astype(jnp.float32)), d_out))
        np.testing.assert_array_equal(got, want)
        ref = x.astype(np.float64) @ np.asarray(w, np.float64)  # and both are the product
        bound = 1e-5 * (np.abs(x) @ np.abs(np.asarray(w, np.float64))) + 1e-6
        assert (np.abs(got - ref) <= bound).all()
        # negative control: the bf16-rounded product is not the f32 one on unrounded weights
        w32 = rng.standard_normal((d_in, d_out)).astype(np.float32)
        rounded = np.asarray(f(x, cpu_linear.pack(w32, jnp.bfloat16), d_out))
        exact = np.asarray(f(x, cpu_linear.pack(w32), d_out))
        assert d_in * d_out < 4 or not np.array_equal(rounded, exact)
    with pytest.raises(ValueError, match="float32, bfloat16 or int8"):
        cpu_linear.pack(w, jnp.float16)


@built
def test_a_bf16_model_decodes_in_bf16_storage_exactly_as_float32_on_its_weights():
    """linear='ffi' keeps a bf16 model's matrices bf16 in the packed tree and computes in float32:
    the tokens of the float32 model on the widened weights, log-probs within float32 rounding of
    its (bit for bit with the programs at LLVM -O0; at XLA's default level the two programs,
    the same HLO but for the weights' types, differ in last bits: 25 of 32 log-probs by
    <= 1.1e-6, BUILD_NOTES nineteenth session), and speculative greedy equals plain greedy."""
    import dataclasses

    from mtpspec.decoding import program

    config = C.tiny_moe(vocab_size=64, **C.TWO_LAYERS)
    p32 = models.init_params(config, jax.random.key(3), norm_scale=0.1)
    bf16 = dataclasses.replace(config, dtype="bfloat16")
    pb = jax.tree.map(lambda x: x.astype(jnp.bfloat16), p32)
    widened = jax.tree.map(lambda x: x.astype(jnp.float32), pb)
    prompts = [[1, 2, 3, 4, 5], [7, 8, 9]]
    run = dict(max_new_tokens=16, return_logprobs=True, linear="ffi")
    level = "xla_backend_optimization_level"
    with pytest.MonkeyPatch.context() as m:  # both programs at -O0: the same bits
        m.setitem(program.CPU_COMPILER_OPTIONS, level, 0)
        at_o0 = [mtpspec.generate(c, p, prompts, **run) for c, p in ((bf16, pb), (config, widened))]
    assert at_o0[0].tokens == at_o0[1].tokens
    np.testing.assert_array_equal(np.array(at_o0[0].logprobs), np.array(at_o0[1].logprobs))
    with pytest.MonkeyPatch.context() as m:  # XLA's default level (users'): last bits only
        m.setitem(program.CPU_COMPILER_OPTIONS, level, USERS_LEVEL[level])
        got = mtpspec.generate(bf16, pb, prompts, **run)
        want = mtpspec.generate(config, widened, prompts, **run)
    assert got.tokens == want.tokens == at_o0[0].tokens
    np.testing.assert_allclose(np.array(got.logprobs), np.array(want.logprobs), rtol=4e-6)
    tree = MEMO.get(inference_compute(bf16), pb, "ffi")
    assert cpu_linear.stored_dtype(tree["lm_head"].w) == jnp.bfloat16  # packed bf16
    assert cpu_linear.stored_dtype(tree["layers"][0]["gdn"]["w_qkv+w_z+w_b+w_a"].w) == jnp.bfloat16
    assert tree["final_norm"].dtype == jnp.float32
    spec = mtpspec.SpecConfig(num_draft=3)
    assert mtpspec.generate(bf16, pb, prompts, speculative=spec, **run).tokens == got.tokens


def inference_compute(config):
    from mtpspec.models.inference import compute_config

    return compute_config(config, "ffi")


# ---- bfloat16 activations in the prompt's forward (KernelSettings.prefill_activations) --------

BF16_DOT = kernel_settings.has_bf16_dot()
bf16_dot = pytest.mark.skipif(not BF16_DOT, reason="needs a CPU with AVX-512 BF16 (vdpbf16ps)")
PREFILL_BF16 = KernelSettings(prefill_activations="bfloat16")


def _bf16_round(a):
    """float32 -> the nearest bf16 (ties to even), as float32 numpy."""
    return np.asarray(jnp.asarray(a, jnp.float32).astype(jnp.bfloat16), np.float32)


def _dpbf16_reference(x, w):
    """bf16(x) @ w the way ``vdpbf16ps`` defines it (Intel's pseudocode): per output, over the
    input pairs (2j, 2j + 1) in order, add the odd product, round to float32, then the even one
    (bf16 x bf16 products are exact in float32); an odd input count ends with a zero pair half."""
    xb = _bf16_round(x)
    if xb.shape[1] % 2:
        xb, w = np.pad(xb, ((0, 0), (0, 1))), np.pad(w, ((0, 1), (0, 0)))
    acc = np.zeros((x.shape[0], w.shape[1]), np.float32)
    for j in range(xb.shape[1] // 2):
        acc = acc + xb[:, 2 * j + 1, None] * w[None, 2 * j + 1]
        acc = acc + xb[:, 2 * j, None] * w[None, 2 * j]
    return acc


def _apply_in_prefill(ks, x, wp, d_out):
    with kernel_settings.use(ks), kernel_settings.prefill_scope():
        return np.asarray(users_jit(cpu_linear.apply, static_argnums=2)(x, wp, d_out))


@built
@bf16_dot
@pytest.mark.parametrize("group", [64, 128])
@pytest.mark.parametrize(
    "rows, d_in, d_out",
    [(1, 64, 16), (7, 130, 200), (13, 517, 300), (40, 256, 1000), (6, 1, 40), (5, 1101, 70)],
)
def test_bf16_activations_are_the_dot_instructions_sum_and_rows_stay_independent(
    rows, d_in, d_out, group
):
    """The prefill's bf16-activation product equals, bit for bit, vdpbf16ps's defined sum on
    numpy's side (x rounded to bf16, pairs in order, odd product first); each row alone gives
    the same bits as in the whole call; outside ``prefill_scope`` the same settings run the
    float32 path (its bits are the float32 kernel's), and the two differ (the negative control)."""
    rng = np.random.default_rng(rows + d_in)
    x = rng.standard_normal((rows, d_in)).astype(np.float32)
    w = _bf16_round(rng.standard_normal((d_in, d_out)).astype(np.float32) * 0.1)
    wp = cpu_linear.pack(w, jnp.bfloat16, group=group)
    got = _apply_in_prefill(PREFILL_BF16, x, wp, d_out)
    np.testing.assert_array_equal(got, _dpbf16_reference(x, w))
    alone = [_apply_in_prefill(PREFILL_BF16, x[r : r + 1], wp, d_out) for r in (0, rows - 1)]
    np.testing.assert_array_equal(np.concatenate(alone), got[[0, rows - 1]])
    with kernel_settings.use(PREFILL_BF16):  # not a prompt's forward: float32 activations
        f32 = np.asarray(users_jit(cpu_linear.apply, static_argnums=2)(x, wp, d_out))
    np.testing.assert_array_equal(f32, _apply_in_prefill(KernelSettings(), x, wp, d_out))
    assert not np.array_equal(f32, got)
    # float32 weights keep float32 activations (the setting is about bf16-stored weights)
    wp32 = cpu_linear.pack(w, jnp.float32, group=group)
    np.testing.assert_array_equal(
        _apply_in_prefill(PREFILL_BF16, x, wp32, d_out),
        _apply_in_prefill(KernelSettings(), x, wp32, d_out),
    )


def test_prefill_activations_are_checked(monkeypatch):
    with pytest.raises(ValueError, match="prefill_activations 'int8'"):
        KernelSettings(prefill_activations="int8")
    env = {"MTPSPEC_CPU_PREFILL_ACTIVATIONS": "fp8"}
    with pytest.raises(ValueError, match="MTPSPEC_CPU_PREFILL_ACTIVATIONS='fp8'"):
        KernelSettings.from_env(env)
    env = {"MTPSPEC_CPU_PREFILL_ACTIVATIONS": "bfloat16"}
    assert KernelSettings.from_env(env).prefill_activations == "bfloat16"
    monkeypatch.setattr(kernel_settings, "has_bf16_dot", lambda: False)
    with pytest.raises(ValueError, match="isa='avx2' forbids"):
        KernelSettings(isa="avx2", prefill_activations="bfloat16").resolved()
    with pytest.raises(OSError, match="AVX-512 BF16"), kernel_settings.use(PREFILL_BF16):
        pass


@built
@bf16_dot
def test_a_bf16_prefill_changes_the_prompts_logits_and_speculation_still_equals_plain():
    """With bf16 activations in the prompt's forward: only the prefill program's linears take
    them (the lowered prefill's calls say dot = 1; the whole program's loop, dot = 0); the first
    token's log-prob moves by the rounding but stays close to the float32 prefill's; speculative
    greedy (MTP k = 1..3) emits plain greedy's tokens, and so does a tree."""
    import dataclasses

    config = C.tiny_moe(vocab_size=64, **C.TWO_LAYERS)
    p32 = models.init_params(config, jax.random.key(3), norm_scale=0.1)
    bf16 = dataclasses.replace(config, dtype="bfloat16")
    pb = jax.tree.map(lambda x: x.astype(jnp.bfloat16), p32)
    prompts = [[1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13], [7, 8, 9]]
    run = dict(max_new_tokens=12, return_logprobs=True, linear="ffi")
    parts = ("prefill", "run")
    exact = mtpspec.generate(bf16, pb, prompts, **run)
    with kernel_settings.use(PREFILL_BF16):
        plain = mtpspec.generate(bf16, pb, prompts, **run)
        prepared = decoding.prepare(bf16, pb, prompts, max_new_tokens=12, linear="ffi")
        texts = {part: prepared.program.lower(prepared.args, part).as_text() for part in parts}
        for spec in (mtpspec.SpecConfig(num_draft=k) for k in (1, 2, 3)):
            assert (
                mtpspec.generate(bf16, pb, prompts, speculative=spec, **run).tokens == plain.tokens
            )
        tree = mtpspec.SpecConfig(num_draft=2, tree=(2, 1))
        assert mtpspec.generate(bf16, pb, prompts, speculative=tree, **run).tokens == plain.tokens
    # the prompt's forward alone takes bf16 activations; the loop's steps keep float32
    assert "dot = 1" in texts["prefill"] and "dot = 0" not in texts["prefill"]
    assert "dot = 1" in texts["run"] and "dot = 0" in texts["run"]
    first = np.array([row[0] for row in plain.logprobs])
    first_exact = np.array([row[0] for row in exact.logprobs])
    assert not np.array_equal(first, first_exact)  # the prompt's rows really are bf16
    np.testing.assert_allclose(first, first_exact, atol=5e-2)
