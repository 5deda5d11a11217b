"""The C++ attention kernel (``mtpspec/kernels/cpu_attention.cc``): values against the XLA form
(``layers.cached_attention``), window invariance, only the live prefix read, use inside loops, the
rule that selects it, and decoding tokens with and without it."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import mtpspec
from mtpspec import config as C
from mtpspec import decoding, models
from mtpspec.kernels import cpu_attention
from mtpspec.models import layers
from mtpspec.models.inference import Linear

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
    got = jax.jit(lambda *a: cpu_attention.apply(*a, d**-0.5))(q, k, v, pos)
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=2e-6)


@built
def test_a_window_equals_its_rows_one_at_a_time_bit_for_bit():
    q, k, v, pos = _inputs(1, 2, 6, 4, 2, 32, 50)
    window = cpu_attention.apply(q, k, v, pos, 0.2)
    for i in range(6):
        one = cpu_attention.apply(q[:, i : i + 1], k, v, pos[:, i : i + 1], 0.2)
        np.testing.assert_array_equal(one[:, 0], window[:, i])


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
def test_kernel_runs_inside_jit_and_while_loop():
    q, k, v, pos = _inputs(3, 1, 2, 4, 2, 16, 12)

    def run(fn):
        body = lambda i, acc: acc + fn(q * (i + 1.0), k, v, pos)  # noqa: E731
        return jax.jit(lambda: jax.lax.fori_loop(0, 4, body, jnp.zeros(q.shape)))()

    got = run(lambda *a: cpu_attention.apply(*a, 0.25))
    want = run(lambda q, k, v, p: layers.cached_attention(q * 0.25 / 16**-0.5, k, v, p))
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5)


@built
def test_no_gradient_through_the_kernel_says_so():
    q, k, v, pos = _inputs(4, 1, 1, 2, 1, 8, 4)
    with pytest.raises(ValueError, match="mtpspec_cpu_attention"):
        jax.grad(lambda q: jnp.sum(cpu_attention.apply(q, k, v, pos, 0.3)))(q)


def test_rule_uses_the_kernel_with_the_cpu_linears_for_decoding_windows(monkeypatch):
    w = jnp.zeros((8, 8))
    ffi, xla = Linear(w, 8, (8,), "ffi"), Linear(w, 8, (8,), "xla")
    if cpu_attention.available():
        assert layers.native_attention({"w_o": ffi}, 1)
        assert layers.native_attention({"w_o": ffi}, cpu_attention.MAX_T)
    assert not layers.native_attention({"w_o": ffi}, cpu_attention.MAX_T + 1)  # prefill
    assert not layers.native_attention({"w_o": xla}, 1)
    assert not layers.native_attention({"w_o": w}, 1)  # canonical tree (training, forward)
    monkeypatch.setattr(cpu_attention.KERNEL, "status", lambda: (False, "not built"))
    assert not layers.native_attention({"w_o": ffi}, 1)
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
def test_decoding_tokens_with_and_without_the_kernel(model, monkeypatch, proposer):
    """The C++ linears with the native attention, and with XLA's attention instead, emit the same
    tokens; speculative decoding through the kernel emits plain greedy's tokens."""
    config, params = model
    prompts = [[1, 2, 3, 4, 5, 6, 7, 1, 2, 3], [5, 3]]
    spec = None if proposer is None else decoding.SpecConfig(proposer, 3)
    kw = dict(max_new_tokens=24, linear="ffi")
    native = mtpspec.generate(config, params, prompts, speculative=spec, **kw)
    plain = mtpspec.generate(config, params, prompts, **kw)
    assert native.tokens == plain.tokens
    decoding.release_compiled()
    monkeypatch.setattr(layers, "native_attention", lambda p, t: False)
    assert mtpspec.generate(config, params, prompts, speculative=spec, **kw).tokens == native.tokens
    decoding.release_compiled()
