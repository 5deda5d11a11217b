"""Every form of the gated delta rule against the recurrence (the reference)."""

from __future__ import annotations

import logging

import hypothesis.strategies as st
import jax
import jax.numpy as jnp
import numpy as np
import pytest
from hypothesis import example, given, settings

from mtpspec import ops
from mtpspec.kernels import cpu_gdn
from tests.gdn_testing import output_scale, random_gdn_inputs, rel_err

CHUNK = 16  # small chunk so that T in {C-1, C, C+1, long} stays cheap
FAST_METHODS = ("chunk", "assoc")
# forward-only forms: the C++ kernel (decoding only, no gradient) where it is built
FORWARD_METHODS = FAST_METHODS + (("ffi",) if cpu_gdn.available() else ())
TOL = 1e-5


def run(method, inputs, **kw):
    q, k, v, g, beta, s0 = inputs
    return ops.gated_delta_rule_with_aux(
        q, k, v, g, beta, initial_state=s0, method=method, chunk_size=CHUNK, **kw
    )


def assert_forms_agree(inputs, method, *, states=True):
    ref_o, ref_s, ref_aux = run("recurrent", inputs, return_states=states)
    o, s, aux = run(method, inputs, return_states=states)
    assert o.shape == ref_o.shape and s.shape == ref_s.shape
    assert s.dtype == jnp.float32
    assert rel_err(o, ref_o) <= TOL, ("o", rel_err(o, ref_o))
    assert rel_err(s, ref_s) <= TOL, ("final state", rel_err(s, ref_s))
    assert rel_err(aux.u, ref_aux.u) <= TOL, ("u", rel_err(aux.u, ref_aux.u))
    np.testing.assert_allclose(aux.g_cum, ref_aux.g_cum, rtol=1e-6, atol=1e-6)
    if states:
        assert rel_err(aux.states, ref_aux.states) <= TOL, ("states",)


@pytest.mark.parametrize("method", FORWARD_METHODS)
@pytest.mark.parametrize("t", [1, CHUNK - 1, CHUNK, CHUNK + 1, 5 * CHUNK + 3])
@pytest.mark.parametrize("with_state", [False, True])
def test_method_matches_recurrence_over_lengths(method, t, with_state):
    inputs = random_gdn_inputs(t, 2, t, 2, 2, 16, 24, with_state=with_state)
    assert_forms_agree(inputs, method)


@pytest.mark.parametrize("method", FORWARD_METHODS)
@pytest.mark.parametrize(
    "b,hk,r,dk,dv",
    [(1, 1, 1, 8, 8), (3, 2, 1, 32, 16), (1, 1, 4, 16, 32), (2, 4, 2, 8, 12)],
)
def test_method_matches_recurrence_over_head_layouts(method, b, hk, r, dk, dv):
    inputs = random_gdn_inputs(7, b, 2 * CHUNK + 5, hk, r, dk, dv)
    assert_forms_agree(inputs, method)


@settings(max_examples=12, deadline=None)
@given(
    b=st.integers(1, 2),
    t=st.integers(1, 40),
    hk=st.integers(1, 2),
    r=st.sampled_from([1, 2, 3]),
    dk=st.sampled_from([4, 8, 16]),
    dv=st.sampled_from([4, 8, 12]),
    chunk=st.sampled_from([4, 8, 16, 64]),
    with_state=st.booleans(),
    method=st.sampled_from(FORWARD_METHODS),
    seed=st.integers(0, 2**16),
)
# found by the fuzzer: q·k = −6e-4 at t = 1, an output 4000× smaller than its terms
@example(b=1, t=1, hk=1, r=1, dk=4, dv=4, chunk=4, with_state=False, method="chunk", seed=11)
def test_fuzzed_shapes_and_chunk_sizes_match_recurrence(
    b, t, hk, r, dk, dv, chunk, with_state, method, seed
):
    q, k, v, g, beta, s0 = random_gdn_inputs(seed, b, t, hk, r, dk, dv, with_state=with_state)
    ref_o, ref_s = ops.gated_delta_rule(q, k, v, g, beta, initial_state=s0, method="recurrent")
    o, s = ops.gated_delta_rule(q, k, v, g, beta, initial_state=s0, method=method, chunk_size=chunk)
    # the output against the size of its terms (q may be nearly orthogonal to every key written)
    assert rel_err(o, ref_o, floor=output_scale(v, s0, dk)) <= TOL
    assert rel_err(s, ref_s) <= TOL


def test_explicit_scale_is_used():
    q, k, v, g, beta, s0 = random_gdn_inputs(3, 1, 9, 1, 2, 8, 8)
    o1, _ = ops.gated_delta_rule(q, k, v, g, beta, initial_state=s0, scale=1.0, method="chunk")
    o2, _ = ops.gated_delta_rule(q, k, v, g, beta, initial_state=s0, scale=0.5, method="chunk")
    ref, _ = ops.gated_delta_rule(q, k, v, g, beta, initial_state=s0, scale=0.5, method="recurrent")
    np.testing.assert_allclose(np.asarray(o1) * 0.5, o2, rtol=1e-5, atol=1e-6)
    assert rel_err(o2, ref) <= TOL


@pytest.mark.parametrize("method", ("recurrent",) + FORWARD_METHODS)
def test_bf16_inputs_error_within_reference_bf16_error(method):
    """bf16 inputs: compared with an f32 evaluation on the same (bf16-rounded) values, each
    method's error is at most 1.5x the reference's own bf16 error (+ a hair for ties)."""
    inputs16 = random_gdn_inputs(11, 2, 2 * CHUNK + 3, 2, 2, 16, 16, dtype=jnp.bfloat16)
    inputs32 = tuple(None if x is None else x.astype(jnp.float32) for x in inputs16)
    exact_o, exact_s, _ = run("recurrent", inputs32)
    ref_o, _, _ = run("recurrent", inputs16)
    o, s, _ = run(method, inputs16)
    assert o.dtype == jnp.bfloat16 and s.dtype == jnp.float32
    ref_err = rel_err(ref_o, exact_o)
    assert 0 < ref_err < 2e-2
    assert rel_err(o, exact_o) <= 1.5 * ref_err + 1e-6
    assert rel_err(s, exact_s) <= TOL  # the state never leaves float32


def test_long_sequence_stays_finite_and_bounded():
    """T = 4096 with slow decay: no NaN/inf, the state stays bounded, chunk == recurrence."""
    q, k, v, g, beta, _ = random_gdn_inputs(5, 1, 4096, 2, 2, 32, 32, decay_scale=0.01)
    o, s = ops.gated_delta_rule(q, k, v, g, beta, method="chunk", chunk_size=64)
    ref_o, ref_s = ops.gated_delta_rule(q, k, v, g, beta, method="recurrent")
    assert bool(jnp.all(jnp.isfinite(o))) and bool(jnp.all(jnp.isfinite(s)))
    # Normalised keys and beta < 1 make the delta rule a bounded, non-expansive update: a
    # numerically unstable form would blow up by orders of magnitude over 4096 steps.
    assert float(jnp.max(jnp.abs(s))) < 10 * float(jnp.max(jnp.abs(v)))
    assert rel_err(o, ref_o) <= 1e-4 and rel_err(s, ref_s) <= 1e-4


@pytest.mark.parametrize("method", FAST_METHODS)
def test_gradients_match_recurrence(method):
    q, k, v, g, beta, s0 = random_gdn_inputs(2, 2, CHUNK + 5, 1, 2, 8, 12)
    rng = np.random.default_rng(0)
    wo = jnp.asarray(rng.standard_normal((2, CHUNK + 5, 2, 12)), jnp.float32)
    ws = jnp.asarray(rng.standard_normal(s0.shape), jnp.float32)

    def loss(m, *args):
        o, s = ops.gated_delta_rule(*args[:5], initial_state=args[5], method=m, chunk_size=CHUNK)
        return jnp.sum(o * wo) + jnp.sum(s * ws)

    argnums = tuple(range(1, 7))
    ref = jax.grad(loss, argnums=argnums)("recurrent", q, k, v, g, beta, s0)
    got = jax.grad(loss, argnums=argnums)(method, q, k, v, g, beta, s0)
    for name, a, e in zip("q k v g beta s0".split(), got, ref, strict=True):
        assert bool(jnp.all(jnp.isfinite(a))), name
        assert rel_err(a, e) <= 1e-4, (name, rel_err(a, e))


@pytest.mark.parametrize("method", ("recurrent",) + FORWARD_METHODS)
def test_state_after_matches_every_prefix_state(method):
    """The replay closed form from (u, g_cum) gives S_n for every n in 0..t, per sequence."""
    inputs = random_gdn_inputs(9, 2, 9, 2, 2, 8, 8)
    q, k, v, g, beta, s0 = inputs
    _, _, ref_aux = run("recurrent", inputs, return_states=True)
    _, _, aux = run(method, inputs)
    kk = jnp.repeat(k, 2, axis=2)
    for n0 in range(10):
        n = jnp.array([n0, 9 - n0])
        got = ops.state_after(s0, kk, aux, n)
        for i in range(2):
            want = s0[i] if n[i] == 0 else ref_aux.states[i, n[i] - 1]
            assert rel_err(got[i], want) <= TOL, (n0, i)


def test_auto_resolves_by_length_and_says_so(caplog):
    assert ops.resolve_gdn_method(1, "gpu") == "recurrent"
    assert ops.resolve_gdn_method(1, "cpu") == "chunk"  # measured faster on CPU (BUILD_NOTES)
    assert ops.resolve_gdn_method(3, "cpu", head_state=32 * 32) == "recurrent"  # small heads
    assert ops.resolve_gdn_method(3, "cpu", head_state=128 * 128) == "chunk"
    assert ops.resolve_gdn_method(6, "cpu", head_state=32 * 32) == "chunk"
    assert ops.resolve_gdn_method(4096) == "chunk"
    q, k, v, g, beta, s0 = random_gdn_inputs(1, 1, 300, 1, 1, 8, 8)
    with caplog.at_level(logging.INFO, logger="mtpspec.ops"):
        o, s = ops.gated_delta_rule(q, k, v, g, beta, initial_state=s0)
    assert "'chunk'" in caplog.text and "t=300" in caplog.text
    ref_o, _ = ops.gated_delta_rule(q, k, v, g, beta, initial_state=s0, method="recurrent")
    assert rel_err(o, ref_o) <= TOL


def _bad_cases():
    q, k, v, g, beta, s0 = random_gdn_inputs(0, 2, 5, 2, 2, 8, 4)
    ok = dict(q=q, k=k, v=v, g=g, beta=beta)
    return [
        (dict(ok, method="bogus"), ValueError, "unknown gated_delta_rule method"),
        (dict(ok, v=v[:, :, :3], g=g[:, :, :3], beta=beta[:, :, :3]), ValueError, "multiple"),
        (dict(ok, k=k[..., :4]), ValueError, "q and k shapes differ"),
        (dict(ok, v=v[:, :4]), ValueError, "v batch/time"),
        (dict(ok, g=g[:, :, :2]), ValueError, "g must have shape"),
        (dict(ok, beta=beta[0]), ValueError, "beta must have rank 3"),
        (dict(ok, q=q[0]), ValueError, "q must have rank 4"),
        (dict(ok, initial_state=s0[:, :, :, :2]), ValueError, "initial_state must have shape"),
        (dict(ok, q=q.astype(jnp.int32)), TypeError, "q must be floating"),
        (dict(ok, v=[[1.0]]), TypeError, "v must be an array"),
        (dict(ok, chunk_size=0), ValueError, "chunk_size"),
        (dict(ok, scale=float("nan")), ValueError, "scale"),
        (
            dict(ok, q=q[:, :0], k=k[:, :0], v=v[:, :0], g=g[:, :0], beta=beta[:, :0]),
            ValueError,
            "t=0",
        ),
    ]


@pytest.mark.parametrize("kwargs,exc,match", _bad_cases())
def test_bad_inputs_raise_clear_errors(kwargs, exc, match):
    kwargs = dict(kwargs)
    args = [kwargs.pop(name) for name in ("q", "k", "v", "g", "beta")]
    with pytest.raises(exc, match=match):
        ops.gated_delta_rule(*args, **kwargs)


@pytest.mark.parametrize("c", [1, 2, 5, 16, 37])
def test_unit_lower_inverse_is_the_inverse(c):
    from mtpspec.ops.gdn.chunk import unit_lower_inverse

    rng = np.random.default_rng(c)
    a = jnp.asarray(np.tril(rng.standard_normal((2, 3, c, c)) * 0.3, -1), jnp.float32)
    t = unit_lower_inverse(a)
    eye = np.eye(c)
    np.testing.assert_allclose(
        np.asarray(t, np.float64) @ (np.asarray(a) + eye), np.broadcast_to(eye, a.shape), atol=1e-5
    )
    np.testing.assert_array_equal(np.triu(np.asarray(t), 1), 0.0)
