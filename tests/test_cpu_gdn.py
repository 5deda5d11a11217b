"""The C++ GDN window kernel (``mtpspec/kernels/cpu_gdn.cc``, GDN method "ffi"): window
invariance, use inside loops, the decoding-only "auto" rule and its refusals, and tokens against
the JAX forms. Its values against the recurrence are in test_gdn.py (every forward oracle)."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import mtpspec
from mtpspec import config as C
from mtpspec import decoding, models, ops
from mtpspec.kernels import cpu_gdn, cpu_linear, settings
from mtpspec.kernels.settings import KernelSettings
from mtpspec.ops.gdn import api as gdn_api
from tests.conftest import users_jit
from tests.gdn_testing import random_gdn_inputs, rel_err
from tests.isa_testing import with_isa

built = pytest.mark.skipif(not cpu_gdn.available(), reason=cpu_gdn.status()[1])
# the token loops' instruction sets this CPU runs (AVX-512 only where it has it)
ISAS = ["avx2"] + (["avx512"] if cpu_linear.has_avx512() else [])


def _ffi(inputs, **kw):
    q, k, v, g, beta, s0 = inputs
    return ops.gated_delta_rule_with_aux(q, k, v, g, beta, initial_state=s0, method="ffi", **kw)


@built
@pytest.mark.parametrize("t,dv", [(2, 8), (3, 8), (8, 8), (3, 64), (3, 12)])
def test_a_window_equals_its_tokens_one_at_a_time_bit_for_bit(t, dv):
    """A token's arithmetic does not depend on the window length: t single steps give exactly the
    window's rows and final state (what makes a verify window and plain steps agree); value rows
    in registers (dv 8, 64) and the plain loop (dv 12)."""
    inputs = random_gdn_inputs(4, 2, t, 2, 2, 16, dv)
    o, final, aux = _ffi(inputs, return_states=True)
    q, k, v, g, beta, s = inputs
    for i in range(t):
        one = tuple(x[:, i : i + 1] for x in (q, k, v, g, beta))
        o_i, s, aux_i = _ffi((*one, s))
        np.testing.assert_array_equal(o_i[:, 0], o[:, i])
        np.testing.assert_array_equal(aux_i.u[:, 0], aux.u[:, i])
        np.testing.assert_array_equal(s, aux.states[:, i])
    np.testing.assert_array_equal(s, final)


@built
@pytest.mark.parametrize("dv", [8, 12, 16, 24, 48, 64, 80, 128])
def test_every_token_loop_gives_the_same_bits_and_the_recurrence(dv):
    """The AVX2 and AVX-512 loops (value rows in registers, in blocks of up to 64 columns: dv a
    multiple of the vector width) and the plain loop (any other dv) compute every lane alike:
    the two instruction sets give identical bits, a chain window and a tree window alike, and
    both match the recurrence."""
    from mtpspec.models.tree import TreeShape

    q, k, v, g, beta, s0 = random_gdn_inputs(dv, 2, 5, 2, 2, 32, dv)
    scale = 32**-0.5  # the recurrence's default
    ref_o, ref_s = ops.gated_delta_rule(q, k, v, g, beta, initial_state=s0, method="recurrent")
    tree = TreeShape((2, 1, 1))
    tq, tk, tv, tg, tb, _ = random_gdn_inputs(dv + 1, 2, tree.rows, 2, 2, 32, dv)
    chains, trees = [], []
    for isa in ISAS:
        o, final, u, states = with_isa(
            isa, lambda *a: cpu_gdn.apply(*a, scale, True), q, k, v, g, beta, s0
        )
        assert rel_err(o, ref_o) <= 1e-5 and rel_err(final, ref_s) <= 1e-5, isa
        np.testing.assert_array_equal(states[:, -1], final)
        chains.append((o, final, u, states))
        tree_fn = lambda *a: cpu_gdn.apply_tree(*a, tree.parent, scale)  # noqa: E731
        trees.append(with_isa(isa, tree_fn, tq, tk, tv, tg, tb, s0))
    for got in (chains, trees):
        for a, b in zip(got[-1], got[0], strict=True):
            np.testing.assert_array_equal(a, b)
    # a tree node equals the chain along its path: node 3 is root -> 1 -> 3
    path = [0, 1, 3]
    assert [int(tree.parent[i]) for i in path[1:]] == path[:-1]
    o, _, _, states = with_isa(
        ISAS[-1],
        lambda *a: cpu_gdn.apply(*a, scale, True),
        *(x[:, path] for x in (tq, tk, tv, tg, tb)),
        s0,
    )
    np.testing.assert_array_equal(trees[-1][0][:, path], o)
    np.testing.assert_array_equal(trees[-1][2][:, path], states)


@built
def test_an_isa_this_cpu_lacks_is_refused_before_any_call(monkeypatch):
    monkeypatch.setattr(settings, "has_avx512", lambda: False)
    inputs = random_gdn_inputs(0, 1, 2, 1, 1, 8, 8)
    with pytest.raises(OSError, match="AVX-512F"), settings.use(KernelSettings(isa="avx512")):
        _ffi(inputs)


@built
def test_kernel_runs_inside_jit_and_while_loop():
    q, k, v, g, beta, s0 = random_gdn_inputs(6, 1, 3, 1, 2, 8, 8)

    def steps(method):
        def body(i, s):
            _, s, _ = ops.gated_delta_rule_with_aux(
                q, k, v * (i + 1.0), g, beta, initial_state=s, method=method
            )
            return s

        return users_jit(lambda s: jax.lax.fori_loop(0, 5, body, s))(s0)

    assert rel_err(steps("ffi"), steps("recurrent")) <= 1e-5


@built
def test_a_minus_inf_gate_resets_the_state():
    q, k, v, g, beta, s0 = random_gdn_inputs(7, 1, 4, 1, 2, 8, 8)
    g = g.at[:, 2].set(-jnp.inf)
    o, s, _ = _ffi((q, k, v, g, beta, s0))
    ref_o, ref_s = ops.gated_delta_rule(q, k, v, g, beta, initial_state=s0, method="recurrent")
    assert bool(jnp.all(jnp.isfinite(o))) and bool(jnp.all(jnp.isfinite(s)))
    assert rel_err(o, ref_o) <= 1e-5 and rel_err(s, ref_s) <= 1e-5


@built
def test_no_gradient_through_the_kernel_says_so():
    q, k, v, g, beta, s0 = random_gdn_inputs(8, 1, 3, 1, 1, 8, 8)
    loss = lambda v: jnp.sum(_ffi((q, k, v, g, beta, s0))[0])  # noqa: E731
    with pytest.raises(ValueError, match="mtpspec_cpu_gdn"):
        jax.grad(loss)(v)


@built
def test_auto_picks_the_kernel_only_for_decoding_windows(caplog):
    small, large = 32 * 32, gdn_api.FFI_MAX_HEAD_STATE + 1
    assert ops.gdn_method_for("auto", 1, native=True, head_state=small) == "ffi"
    assert ops.gdn_method_for("auto", gdn_api.FFI_MAX_T, native=True, head_state=small) == "ffi"
    assert (
        ops.gdn_method_for("auto", gdn_api.FFI_MAX_T + 1, native=True, head_state=small) == "auto"
    )
    assert ops.gdn_method_for("auto", 3, native=True, head_state=128 * 128) == "ffi"  # Qwen3.5
    assert ops.gdn_method_for("auto", 3, native=True, head_state=large) == "auto"  # S beyond L2
    assert ops.gdn_method_for("auto", 3, native=True) == "auto"  # head size unknown
    assert ops.gdn_method_for("auto", 3, head_state=small) == "auto"  # not decoding: never
    sharded = ops.gdn_method_for("auto", 3, native=True, head_state=small, sharded=True)
    assert sharded != "ffi"  # not partitioned
    assert ops.resolve_gdn_method(3, "cpu", head_state=small) != "ffi"


def test_explicit_ffi_is_refused_where_it_cannot_run(monkeypatch):
    with pytest.raises(ValueError, match="device mesh"):
        ops.gdn_method_for("ffi", 3, sharded=True)
    monkeypatch.setattr(cpu_gdn.KERNEL, "status", lambda: (False, "no library here"))
    with pytest.raises(OSError, match="no library here"):
        ops.gdn_method_for("ffi", 3)
    inputs = random_gdn_inputs(0, 1, 3, 1, 1, 4, 4)
    with pytest.raises(OSError, match="no library here"):
        _ffi(inputs)
    auto = ops.gdn_method_for("auto", 3, native=True, head_state=16)
    assert auto == "auto"  # auto just does without it


@pytest.fixture(scope="module")
def model():
    config = C.tiny_hybrid(
        vocab_size=64, layer_types=(C.LINEAR, C.FULL, C.LINEAR), mlp_types=("dense",) * 3
    )
    return config, models.init_params(config, jax.random.key(9), norm_scale=0.1)


@built
@pytest.mark.parametrize("k", [1, 3])
def test_verify_windows_through_the_kernel_emit_plain_greedy_tokens(model, k):
    config, params = model
    prompts = [[1, 2, 3, 4, 5, 6, 7, 1, 2, 3], [5, 3]]
    plain = mtpspec.generate(config, params, prompts, max_new_tokens=20)
    for method in ("ffi", "chunk", "recurrent"):
        spec = decoding.SpecConfig("ngram", k, verify_method=method)
        got = mtpspec.generate(config, params, prompts, max_new_tokens=20, speculative=spec)
        assert got.tokens == plain.tokens, method


@built
def test_the_mtp_loop_copies_neither_a_gdn_state_nor_a_kv_cache(monkeypatch):
    """Per verify step the native commit writes each GDN state into the pre-window state's
    buffer, and the chained MTP drafts write into the MTP cache past its length: the compiled
    loop body copies neither (``analysis.loop_copies``). Negative controls: the commit without its
    buffer alias copies every GDN state; drafting into a throw-away cache copies the MTP cache."""
    from mtpspec import analysis
    from mtpspec.decoding.proposers.mtp import MTPProposer

    config = C.default_like(3, 128)  # [GDN, GDN, attention], GDN heads of 32 x 32, MTP
    params = models.init_params(config, jax.random.key(2), norm_scale=0.1)
    spec = decoding.SpecConfig("mtp", 3, commit="replay", verify_method="ffi")
    state_shape = f"f32[1, {config.linear_num_value_heads}, 32, 32]"

    def copies(prompt_len):  # a new prompt length: a new program, traced with the patches
        prompt = [list(range(1, prompt_len + 1))]
        prep = decoding.prepare(config, params, prompt, max_new_tokens=8, speculative=spec)
        return [shape for shape, size in analysis.loop_copies(prep) if size > 64]

    assert copies(20) == []
    monkeypatch.setattr(cpu_gdn, "COMMIT_ALIASES", None)
    assert copies(40).count(state_shape) == 2  # both GDN layers
    propose = MTPProposer.propose
    monkeypatch.setattr(
        MTPProposer, "propose", lambda self, *a, **k: propose(self, *a, **k)._replace(state=None)
    )
    n = decoding.prepare(
        config, params, [[1] * 60], max_new_tokens=8, speculative=spec
    ).key.capacity
    assert {f"f32[1, 1, {n}, 32]", f"f32[1, 1, 32, {n}]"} <= set(copies(60))  # k, v^T


def test_decoding_without_the_kernel_gives_the_same_tokens(model, monkeypatch):
    config, params = model
    prompts = [[4, 4, 2, 9, 4, 4, 2]]
    spec = decoding.SpecConfig("ngram", 2)
    with_kernel = mtpspec.generate(config, params, prompts, max_new_tokens=12, speculative=spec)
    monkeypatch.setattr(cpu_gdn.KERNEL, "status", lambda: (False, "not built"))
    without = mtpspec.generate(config, params, prompts, max_new_tokens=12, speculative=spec)
    assert without.tokens == with_kernel.tokens
    with pytest.raises(OSError, match="not built"):
        mtpspec.generate(
            config,
            params,
            prompts,
            max_new_tokens=4,
            speculative=decoding.SpecConfig("ngram", 2, verify_method="ffi"),
        )


@built
@pytest.mark.parametrize("dims", [(4, 16, 24), (2, 64, 64), (3, 8, 5)])
def test_native_replay_commit_equals_the_closed_form_for_every_count(dims):
    """``cpu_gdn.commit`` (the "replay" commit in C++) against ``ops.state_after`` for every n in
    0..t on every row, key and value widths unequal and not multiples of 8 included."""
    h, dk, dv = dims
    rng = np.random.default_rng(h * dk + dv)
    b, t = 3, 5
    s0 = jnp.asarray(rng.standard_normal((b, h, dk, dv)), jnp.float32)
    k = jnp.asarray(rng.standard_normal((b, t, h, dk)), jnp.float32)
    u = jnp.asarray(rng.standard_normal((b, t, h, dv)), jnp.float32)
    g_cum = jnp.cumsum(-jnp.asarray(rng.random((b, t, h)), jnp.float32) * 2.0, axis=1)
    native = users_jit(cpu_gdn.commit)
    for j in range(t + 1):
        n = jnp.asarray([j, t - j, min(j + 2, t)], jnp.int32)
        want = ops.state_after(s0, k, ops.GDNAux(u, g_cum), n)
        assert rel_err(native(s0, k, u, g_cum, n), want) <= 1e-6, j
    assert np.array_equal(native(s0, k, u, g_cum, jnp.zeros((b,), jnp.int32)), s0)  # n = 0: S_0


@built
def test_native_commit_takes_the_final_state_as_is_for_a_whole_window():
    """Given the state a window ended in, rows that keep all t positions get it bit for bit (the
    recurrence's own state: what plain steps hold), the others the closed form as without it."""
    q, k, v, g, beta, s0 = random_gdn_inputs(5, 3, 4, 2, 2, 16, 16)
    o, final, aux = _ffi((q, k, v, g, beta, s0))
    k_heads = ops.expand_key_heads(k, 4)
    n = jnp.asarray([4, 2, 0], jnp.int32)
    native = users_jit(cpu_gdn.commit)
    with_final = native(s0, k_heads, aux.u, aux.g_cum, n, final)
    without = native(s0, k_heads, aux.u, aux.g_cum, n)
    np.testing.assert_array_equal(with_final[0], final[0])
    np.testing.assert_array_equal(with_final[1:], without[1:])
    assert rel_err(without[0], final[0]) <= 1e-5  # the closed form: the same state, other bits
    with pytest.raises(ValueError, match="final"):
        cpu_gdn.commit(s0, k_heads, aux.u, aux.g_cum, n, final[:, :1])


@built
def test_native_replay_commit_refuses_bad_windows_and_counts():
    t = cpu_gdn.COMMIT_MAX_T + 1
    z = jnp.zeros
    with pytest.raises(ValueError, match="up to 64"):
        cpu_gdn.commit(z((1, 1, 4, 4)), z((1, t, 1, 4)), z((1, t, 1, 4)), z((1, t, 1)), z((1,)))
    with pytest.raises(ValueError):  # a concrete count outside 0..t, as ops.state_after
        four = jnp.full((1,), 4, jnp.int32)
        cpu_gdn.commit(z((1, 1, 4, 4)), z((1, 3, 1, 4)), z((1, 3, 1, 4)), z((1, 3, 1)), four)


@built
@pytest.mark.parametrize("t", [1, 40])
def test_the_helper_thread_changes_no_bit(t):
    """Heads are shared with a helper thread of XLA's pool (long windows): whichever thread runs
    a head, its arithmetic is the same. The one jitted function is traced afresh per setting
    (JAX's caches key on ``settings.use``; the lowered call must carry it)."""
    q, k, v, g, beta, s0 = random_gdn_inputs(t, 2, t, 2, 4, 64, 32)
    got = []
    fn = users_jit(lambda *a: cpu_gdn.apply(*a, 0.125, True))
    for threads in (1, 2, 3):
        with settings.use(KernelSettings(gdn_threads=threads)):
            assert f"threads = {threads} : i64" in fn.lower(q, k, v, g, beta, s0).as_text()
            got.append([np.asarray(x) for x in fn(q, k, v, g, beta, s0)])
    for outs in got[1:]:
        for a, b in zip(outs, got[0], strict=True):
            np.testing.assert_array_equal(a, b)


@built
def test_a_library_from_other_sources_is_refused(monkeypatch):
    """A stale build (its FFI signatures differ from what the wrappers pass) is reported
    unavailable with the fix, never called."""
    from mtpspec.kernels import library

    assert library.handle().mtpspec_cpu_kernels_abi() == library.ABI
    monkeypatch.setattr(library, "ABI", library.ABI + 1)
    lib, why = library._load.__wrapped__()
    assert lib is None and "make install" in why


@built
def test_the_tree_walk_shares_heads_without_changing_a_bit():
    """The native GDN tree walk (``apply_tree``) with its heads shared between threads (a 23-node
    window of 64 x 64 heads: past the sharing threshold) gives the same bits as on one thread."""
    from mtpspec.models.tree import TreeShape

    tree = TreeShape((2, 2, 2, 1))
    q, k, v, g, beta, s0 = random_gdn_inputs(3, 2, tree.rows, 2, 2, 64, 64)
    got = []
    fn = users_jit(lambda *a: cpu_gdn.apply_tree(*a, tree.parent, 0.125))
    for threads in (1, 2):
        with settings.use(KernelSettings(gdn_threads=threads)):
            assert f"threads = {threads} : i64" in fn.lower(q, k, v, g, beta, s0).as_text()
            got.append([np.asarray(x) for x in fn(q, k, v, g, beta, s0)])
    for a, b in zip(got[1], got[0], strict=True):
        np.testing.assert_array_equal(a, b)
