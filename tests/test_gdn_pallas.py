"""method="pallas" (``ops/gdn/pallas_gpu.py``) against the recurrence, in interpret mode on CPU.

Shapes are small on purpose (interpret mode is slow and the suite shares 2 cores) but off-tile:
t not a multiple of the chunk, key/value dims not powers of two, K != V, r in {1, 2}, more value
columns than one program's block. The Triton lowering is checked by lowering for CUDA (no GPU
needed to build the Triton IR; compiling it to PTX and running it is not checked here).
"""

from __future__ import annotations

import logging

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from mtpspec import ops
from mtpspec.ops.gdn import api, pallas_gpu
from tests.gdn_testing import random_gdn_inputs, rel_err

TOL = 1e-5


def _both(inputs, chunk, states=False, **kw):
    q, k, v, g, beta, s0 = inputs
    run = lambda m: ops.gated_delta_rule_with_aux(  # noqa: E731
        q, k, v, g, beta, initial_state=s0, method=m, chunk_size=chunk, return_states=states, **kw
    )
    return run("pallas"), run("recurrent")


@pytest.mark.parametrize(
    "b,t,hk,r,dk,dv,with_state,chunk",
    [
        (2, 37, 1, 2, 16, 24, True, 16),  # off-tile t, r = 2, K != V, V padded 24 -> 32
        (1, 20, 2, 1, 8, 16, False, 16),  # r = 1, no initial state, K padded 8 -> 16
        (1, 70, 1, 1, 32, 80, True, 32),  # 3 chunks of 32; V = 80 -> 128 = 2 value blocks
    ],
)
def test_pallas_matches_recurrence_on_off_tile_shapes(b, t, hk, r, dk, dv, with_state, chunk):
    inputs = random_gdn_inputs(t + dv, b, t, hk, r, dk, dv, with_state=with_state)
    (o, s, aux), (ref_o, ref_s, ref_aux) = _both(inputs, chunk)
    assert o.shape == ref_o.shape and s.shape == ref_s.shape and s.dtype == jnp.float32
    assert rel_err(o, ref_o) <= TOL, ("o", rel_err(o, ref_o))
    assert rel_err(s, ref_s) <= TOL, ("final state", rel_err(s, ref_s))
    assert rel_err(aux.u, ref_aux.u) <= TOL, ("u", rel_err(aux.u, ref_aux.u))
    np.testing.assert_allclose(aux.g_cum, ref_aux.g_cum, rtol=1e-6, atol=1e-6)
    assert aux.states is None


@pytest.mark.parametrize("t", [9])  # k = 8 drafts; t = 5 runs in the model test below
def test_verify_window_commit_data_matches_and_commits_every_prefix(t):
    """t = k+1 <= 16 runs as one chunk of 16 and returns GDNAux(u, g_cum, states) equal to the
    chunked and recurrent forms'; ``state_after`` from it gives S_n for every n in 0..t."""
    inputs = random_gdn_inputs(t, 2, t, 1, 2, 16, 24)
    q, k, v, g, beta, s0 = inputs
    (o, s, aux), (ref_o, ref_s, ref_aux) = _both(inputs, None, states=True)
    _, _, chunk_aux = ops.gated_delta_rule_with_aux(
        q, k, v, g, beta, initial_state=s0, method="chunk", return_states=True
    )
    assert aux.states.shape == ref_aux.states.shape == (2, t, 2, 16, 24)
    for name, want in (("recurrent", ref_aux), ("chunk", chunk_aux)):
        assert rel_err(aux.u, want.u) <= TOL, (name, "u")
        assert rel_err(aux.states, want.states) <= TOL, (name, "states")
        np.testing.assert_allclose(aux.g_cum, want.g_cum, rtol=1e-6, atol=1e-6)
    assert rel_err(o, ref_o) <= TOL and rel_err(s, ref_s) <= TOL
    kk = jnp.repeat(k, 2, axis=2)
    for n0 in range(t + 1):
        n = jnp.array([n0, t - n0])
        got = ops.state_after(s0, kk, aux, n)
        for i in range(2):
            want = s0[i] if n[i] == 0 else ref_aux.states[i, n[i] - 1]
            assert rel_err(got[i], want) <= TOL, (n0, i)


def test_bf16_inputs_error_within_reference_bf16_error():
    """Against an f32 evaluation of the same bf16-rounded values, the kernel's error is at most
    1.5x the reference's own bf16 error; the state stays float32."""
    inputs16 = random_gdn_inputs(11, 2, 35, 2, 2, 16, 16, dtype=jnp.bfloat16)
    inputs32 = tuple(None if x is None else x.astype(jnp.float32) for x in inputs16)
    q, k, v, g, beta, s0 = inputs32
    exact_o, exact_s = ops.gated_delta_rule(q, k, v, g, beta, initial_state=s0, method="recurrent")
    (o, s, _), (ref_o, _, _) = _both(inputs16, 16)
    assert o.dtype == jnp.bfloat16 and s.dtype == jnp.float32
    ref_err = rel_err(ref_o, exact_o)
    assert 0 < ref_err < 2e-2
    assert rel_err(o, exact_o) <= 1.5 * ref_err + 1e-6
    assert rel_err(s, exact_s) <= TOL


def test_gradients_go_through_the_custom_vjp_and_match_recurrence():
    q, k, v, g, beta, s0 = random_gdn_inputs(2, 1, 21, 1, 2, 8, 12)
    rng = np.random.default_rng(0)
    wo = jnp.asarray(rng.standard_normal((1, 21, 2, 12)), jnp.float32)
    ws = jnp.asarray(rng.standard_normal(s0.shape), jnp.float32)

    def loss(m, *args):
        o, s = ops.gated_delta_rule(*args[:5], initial_state=args[5], method=m, chunk_size=16)
        return jnp.sum(o * wo) + jnp.sum(s * ws)

    argnums = tuple(range(1, 7))
    args = (q, k, v, g, beta, s0)
    grad_fn = jax.grad(loss, argnums=argnums)
    # The forward goes through the custom_vjp, and the gradient program holds a single
    # pallas_call (the forward's): the backward is the chunked XLA form, not a JVP of the kernel.
    assert "custom_vjp_call" in str(jax.make_jaxpr(loss, static_argnums=0)("pallas", *args))
    assert str(jax.make_jaxpr(grad_fn, static_argnums=0)("pallas", *args)).count("pallas_call") == 1
    ref = grad_fn("recurrent", *args)
    got = grad_fn("pallas", *args)
    for name, a, e in zip("q k v g beta s0".split(), got, ref, strict=True):
        assert bool(jnp.all(jnp.isfinite(a))), name
        assert rel_err(a, e) <= 1e-4, (name, rel_err(a, e))


def test_wrong_mask_kernel_fails_the_comparison(monkeypatch):
    """Negative control: with A's mask made inclusive (the diagonal leaks into the solve) the
    kernel's output is far from the recurrence, so the comparisons above can fail."""
    inputs = random_gdn_inputs(4, 1, 19, 1, 1, 16, 16)
    q, k, v, g, beta, s0 = inputs
    ref_o, ref_s = ops.gated_delta_rule(q, k, v, g, beta, initial_state=s0, method="recurrent")
    cfg = pallas_gpu.PallasConfig(scale=0.25, chunk=16, return_states=False, interpret=True)
    good = pallas_gpu.gdn_pallas(q, k, v, g, beta, s0, cfg)
    monkeypatch.setattr(pallas_gpu, "_strict_lower", lambda rows, cols: rows >= cols)
    bad = pallas_gpu.gdn_pallas(q, k, v, g, beta, s0, cfg)
    assert rel_err(good[0], ref_o) <= TOL and rel_err(good[1], ref_s) <= TOL
    assert rel_err(bad[0], ref_o) > 1e-2 and rel_err(bad[1], ref_s) > 1e-2


def test_auto_does_not_pick_pallas_until_a_gpu_check_has_passed():
    # The kernel has only run in interpret mode: "auto" keeps to the chunked form on GPU until
    # a recorded GPU check passes (then api.AUTO_PALLAS_PLATFORMS = ("gpu",); BUILD_NOTES.md).
    assert api.AUTO_PALLAS_PLATFORMS == ()
    assert ops.resolve_gdn_method(4096, "gpu") == "chunk"
    assert ops.resolve_gdn_method(2, "gpu") == "chunk"
    assert ops.resolve_gdn_method(1, "gpu") == "recurrent"


def test_gdn_method_for_a_mesh_refuses_pallas_and_resolves_auto():
    assert ops.gdn_method_for("pallas", 4) == "pallas"  # one device: as asked
    assert ops.gdn_method_for("auto", 4) == "auto"  # resolved per call, with its dtypes
    assert ops.gdn_method_for("auto", 1, sharded=True) == "chunk"  # CPU: measured faster
    assert ops.gdn_method_for("auto", 3, sharded=True) == "chunk"
    assert ops.gdn_method_for("recurrent", 3, sharded=True) == "recurrent"
    with pytest.raises(ValueError, match="cannot run under a device mesh"):
        ops.gdn_method_for("pallas", 3, sharded=True)
    with pytest.raises(ValueError, match="unknown GDN method"):
        ops.gdn_method_for("fast", 3)


def test_auto_picks_pallas_on_an_enabled_platform_and_says_so(monkeypatch, caplog):
    monkeypatch.setattr(api, "AUTO_PALLAS_PLATFORMS", ("gpu",))  # as after a passed GPU check
    assert ops.resolve_gdn_method(4096, "gpu") == "pallas"
    assert ops.resolve_gdn_method(2, "gpu") == "pallas"  # verify windows too
    assert ops.resolve_gdn_method(1, "gpu") == "recurrent"  # a decode step
    assert ops.resolve_gdn_method(4096, "gpu", pallas_ok=False) == "chunk"
    assert ops.resolve_gdn_method(4096, "cpu") == "chunk"
    assert ops.resolve_gdn_method(4096, "tpu") == "chunk"
    q, k, v, g, beta, s0 = random_gdn_inputs(1, 1, 33, 1, 1, 8, 8)
    # Faked GPU backend: only traced (make_jaxpr), never lowered, so no GPU is needed. The
    # platform is a static argument of the jitted dispatcher, so this trace is cached apart
    # from the CPU ones.
    monkeypatch.setattr(api.jax, "default_backend", lambda: "gpu")
    fn = lambda *a: ops.gated_delta_rule(*a[:5], initial_state=a[5])  # noqa: E731
    with caplog.at_level(logging.INFO, logger="mtpspec.ops"):
        jaxpr = str(jax.make_jaxpr(fn)(q, k, v, g, beta, s0))
        f16 = [x.astype(jnp.float16) for x in (q, k, v)]
        jaxpr16 = str(jax.make_jaxpr(fn)(*f16, g, beta, s0))
    assert "t=33 on gpu -> 'pallas'" in caplog.text and "pallas_call" in jaxpr
    assert "'chunk'" in caplog.text and "pallas_call" not in jaxpr16  # float16: not supported


@pytest.mark.parametrize(
    "change,match",
    [
        (dict(dtype=jnp.float16), "float32 or bfloat16 q, got dtype float16"),
        (dict(dk=512), "key_dim <= 256"),
        (dict(chunk_size=48), "chunk_size in"),
        (dict(platform="tpu"), "not on platform 'tpu'"),
    ],
)
def test_explicit_pallas_raises_instead_of_falling_back(monkeypatch, change, match):
    dk = change.get("dk", 8)
    q, k, v, g, beta, _ = random_gdn_inputs(1, 1, 4, 1, 1, dk, 8)
    if "dtype" in change:
        q, k, v = (x.astype(change["dtype"]) for x in (q, k, v))
    if "platform" in change:
        monkeypatch.setattr(api.jax, "default_backend", lambda: change["platform"])
    with pytest.raises(ValueError, match=match):
        ops.gated_delta_rule(q, k, v, g, beta, method="pallas", chunk_size=change.get("chunk_size"))


@pytest.mark.parametrize(
    "t,dk,dv,chunk,states",
    [(100, 128, 128, 32, False), (5, 128, 96, 16, True), (300, 64, 128, 64, False)],
)
def test_kernel_lowers_to_triton_for_cuda(t, dk, dv, chunk, states):
    """Lowering for CUDA (no GPU needed) builds the Triton IR: every op in the kernel has a Triton
    lowering rule in this JAX and every loaded/stored tile is a power of two. What this cannot
    check: Triton's compilation to PTX (register pressure, layouts) and the run on a GPU."""
    bf = jnp.bfloat16
    q = jnp.zeros((1, t, 2, dk), bf)
    v = jnp.zeros((1, t, 4, dv), bf)
    g = jnp.zeros((1, t, 4), jnp.float32)
    s0 = jnp.zeros((1, 4, dk, dv), jnp.float32)
    cfg = pallas_gpu.PallasConfig(
        scale=0.1, chunk=pallas_gpu.effective_chunk(t, chunk), return_states=states, interpret=False
    )
    fn = jax.jit(pallas_gpu.gdn_pallas, static_argnums=6)
    text = fn.trace(q, q, v, g, g, s0, cfg).lower(lowering_platforms=("cuda",)).as_text()
    assert text.count("__gpu$xla.gpu.triton") == 1


def test_model_verify_window_with_pallas_equals_chunk_including_commit_data():
    """The decoder's verify window (``window_step`` with per-position states, ragged ``valid``,
    a non-zero GDN state and conv window) gives the same logits, caches and GDN commit data with
    method "pallas" as with "chunk"."""
    from mtpspec import config as C
    from mtpspec import models

    config = C.tiny_hybrid(layer_types=(C.LINEAR, C.FULL), mlp_types=("dense",) * 2)
    params = models.init_params(config, jax.random.key(3), norm_scale=0.1)
    state = models.init_decode_state(config, 2, 16)
    gdn = state.layers[0]
    keys = jax.random.split(jax.random.key(5), 2)
    gdn = gdn._replace(
        state=0.3 * jax.random.normal(keys[0], gdn.state.shape),
        conv=jax.random.normal(keys[1], gdn.conv.shape).astype(gdn.conv.dtype),
    )
    state = state._replace(layers=(gdn,) + state.layers[1:])
    tokens = jax.random.randint(jax.random.key(1), (2, 5), 0, config.vocab_size)
    valid = jnp.array([2, 5])

    def window(method):
        return models.window_step(
            config, params, state, tokens, valid, gdn_method=method, gdn_states=True
        )

    ref, got = window("chunk"), window("pallas")
    assert got.commit[0].aux.states.shape[:2] == (2, 5)
    for a, b in zip(jax.tree.leaves(got), jax.tree.leaves(ref), strict=True):
        assert a.shape == b.shape and a.dtype == b.dtype
        assert np.array_equal(a, b) if a.dtype == jnp.int32 else rel_err(a, b) <= TOL


def test_tiles_are_powers_of_two_and_windows_run_as_one_chunk():
    assert [pallas_gpu.effective_chunk(t, 64) for t in (1, 2, 9, 16)] == [16] * 4
    assert [pallas_gpu.effective_chunk(t, c) for t, c in ((17, 64), (37, 16), (5000, 32))] == [
        32,
        16,
        32,
    ]
    assert [pallas_gpu.padded_dim(d) for d in (1, 8, 16, 24, 80, 128)] == [16, 16, 16, 32, 128, 128]


def test_nearly_parallel_keys_stay_exact():
    """Near-identical keys, β ≈ 1, slow decay (conv-smoothed keys of a real layer look like this):
    (I + A) is then close to all-ones lower-triangular, whose inverse a power series (Neumann /
    doubling) would compute by cancelling huge terms. The forward substitution stays at 1e-5."""
    q, k, v, g, beta, s0 = random_gdn_inputs(3, 1, 64, 1, 2, 16, 16, decay_scale=0.01)
    rng = np.random.default_rng(0)
    keys = rng.standard_normal(16) + 0.05 * rng.standard_normal(k.shape)
    k = jnp.asarray(keys / np.linalg.norm(keys, axis=-1, keepdims=True), jnp.float32)
    beta = jnp.full_like(beta, 0.99)
    ref_o, ref_s = ops.gated_delta_rule(q, k, v, g, beta, initial_state=s0, method="recurrent")
    o, s = ops.gated_delta_rule(q, k, v, g, beta, initial_state=s0, method="pallas", chunk_size=32)
    assert rel_err(o, ref_o) <= TOL and rel_err(s, ref_s) <= TOL
