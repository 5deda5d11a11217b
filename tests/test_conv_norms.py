"""Causal conv1d and the GDN norms against plain NumPy loops."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from mtpspec import ops


def numpy_causal_conv(x, weight, bias, window, silu=True):
    """Direct definition: y_t = Σ_i w[:, i] · [window ‖ x][t + i] (+ bias), then SiLU."""
    xp = np.concatenate([window, x], axis=1).astype(np.float64)
    w = weight.shape[1]
    t = x.shape[1]
    y = np.zeros(x.shape, np.float64)
    for s in range(t):
        for i in range(w):
            y[:, s] += weight[:, i] * xp[:, s + i]
    if bias is not None:
        y += bias
    if silu:
        y = y / (1.0 + np.exp(-y))
    return y, xp[:, xp.shape[1] - (w - 1) :]


@pytest.fixture
def conv_data():
    rng = np.random.default_rng(0)
    b, t, c, w = 2, 11, 6, 4
    return (
        rng.standard_normal((b, t, c)).astype(np.float32),
        rng.standard_normal((c, w)).astype(np.float32),
        rng.standard_normal((c,)).astype(np.float32),
        rng.standard_normal((b, w - 1, c)).astype(np.float32),
    )


@pytest.mark.parametrize("use_bias", [False, True])
@pytest.mark.parametrize("silu", [False, True])
def test_causal_conv_matches_numpy_definition(conv_data, use_bias, silu):
    x, weight, bias, window = conv_data
    bias = bias if use_bias else None
    y, new_window = ops.causal_conv1d(
        jnp.asarray(x),
        jnp.asarray(weight),
        None if bias is None else jnp.asarray(bias),
        initial_window=jnp.asarray(window),
        activation="silu" if silu else None,
    )
    want_y, want_window = numpy_causal_conv(x, weight, bias, window, silu)
    np.testing.assert_allclose(y, want_y, rtol=1e-5, atol=1e-5)
    np.testing.assert_array_equal(new_window, want_window)


def test_conv_matches_torch_conv1d_layout_on_zero_window(conv_data):
    """With no initial window, the result is PyTorch's Conv1d(groups=c, padding=w-1)[..., :t]."""
    x, weight, _, _ = conv_data
    y, _ = ops.causal_conv1d(jnp.asarray(x), jnp.asarray(weight), activation=None)
    w = weight.shape[1]
    # Cross-correlation of the zero-padded sequence, per channel.
    xp = np.pad(x, [(0, 0), (w - 1, 0), (0, 0)])
    want = np.stack(
        [
            np.stack([np.correlate(xp[b, :, c], weight[c], "valid") for c in range(x.shape[2])], -1)
            for b in range(x.shape[0])
        ]
    )
    np.testing.assert_allclose(y, want, rtol=1e-5, atol=1e-5)


def test_step_by_step_and_split_sequences_equal_whole_sequence(conv_data):
    x, weight, bias, window = (jnp.asarray(a) for a in conv_data)
    y, final = ops.causal_conv1d(x, weight, bias, initial_window=window)
    win = window
    for t in range(x.shape[1]):
        y_t, win = ops.causal_conv1d_step(x[:, t], win, weight, bias)
        np.testing.assert_allclose(y_t, y[:, t], rtol=1e-6, atol=1e-6)
    np.testing.assert_array_equal(win, final)
    y1, w1 = ops.causal_conv1d(x[:, :4], weight, bias, initial_window=window)
    y2, w2 = ops.causal_conv1d(x[:, 4:], weight, bias, initial_window=w1)
    np.testing.assert_allclose(jnp.concatenate([y1, y2], 1), y, rtol=1e-6, atol=1e-6)
    np.testing.assert_array_equal(w2, final)


def test_conv_window_after_every_prefix(conv_data):
    x, weight, bias, window = (jnp.asarray(a) for a in conv_data)
    t = x.shape[1]
    for n0 in range(t + 1):
        n = jnp.array([n0, t - n0])
        got = jax.jit(ops.conv_window_after)(window, x, n)
        for i in range(2):
            _, want = ops.causal_conv1d(
                x[i : i + 1, : int(n[i])], weight, bias, initial_window=window[i : i + 1]
            )
            np.testing.assert_array_equal(got[i], want[0])


def test_width_one_conv_has_empty_window():
    x = jnp.ones((1, 3, 2))
    y, win = ops.causal_conv1d(x, jnp.full((2, 1), 2.0), activation=None)
    assert win.shape == (1, 0, 2)
    np.testing.assert_allclose(y, 2.0 * x)


def test_conv_bad_inputs():
    x = jnp.ones((1, 3, 4))
    with pytest.raises(ValueError, match="weight must be"):
        ops.causal_conv1d(x, jnp.ones((5, 4)))
    with pytest.raises(ValueError, match="conv window must have shape"):
        ops.causal_conv1d(x, jnp.ones((4, 4)), initial_window=jnp.ones((1, 2, 4)))
    with pytest.raises(ValueError, match="activation"):
        ops.causal_conv1d(x, jnp.ones((4, 4)), activation="gelu")
    with pytest.raises(ValueError, match="x must have rank 2"):
        ops.causal_conv1d_step(x, jnp.ones((1, 3, 4)), jnp.ones((4, 4)))


def test_norms_match_numpy():
    rng = np.random.default_rng(1)
    x = rng.standard_normal((3, 5, 16)).astype(np.float32)
    gate = rng.standard_normal((3, 5, 16)).astype(np.float32)
    w = (0.1 * rng.standard_normal(16)).astype(np.float32)
    eps = 1e-6
    x64 = x.astype(np.float64)
    np.testing.assert_allclose(
        ops.l2_norm(jnp.asarray(x)),
        x64 / np.sqrt((x64**2).sum(-1, keepdims=True) + eps),
        rtol=1e-5,
    )
    rms = x64 / np.sqrt((x64**2).mean(-1, keepdims=True) + eps)
    np.testing.assert_allclose(
        ops.rms_norm(jnp.asarray(x), jnp.asarray(w), eps=eps), rms * (1 + w), rtol=1e-5
    )
    np.testing.assert_allclose(
        ops.rms_norm(jnp.asarray(x), jnp.asarray(w), eps=eps, unit_offset=False),
        rms * w,
        rtol=1e-5,
        atol=1e-7,
    )
    silu = gate / (1 + np.exp(-gate.astype(np.float64)))
    np.testing.assert_allclose(
        ops.gated_rms_norm(jnp.asarray(x), jnp.asarray(gate), jnp.asarray(1 + w), eps=eps),
        rms * (1 + w) * silu,
        rtol=1e-5,
        atol=1e-7,
    )
    with pytest.raises(ValueError, match="same shape"):
        ops.gated_rms_norm(jnp.asarray(x), jnp.asarray(gate[:, :2]), jnp.asarray(w))


def test_norms_keep_bf16_dtype():
    x = jnp.ones((2, 8), jnp.bfloat16)
    assert ops.rms_norm(x, jnp.zeros(8)).dtype == jnp.bfloat16
    assert ops.l2_norm(x).dtype == jnp.bfloat16


def test_argmax_is_jnp_argmax_on_vocabulary_axes():
    """``ops.argmax`` (two plain reductions from TWO_PASS_FROM entries on) gives ``jnp.argmax``'s
    index: random rows, ties (the lowest index), a NaN (the first NaN), all -inf, +inf; short
    axes take jnp.argmax itself."""
    from mtpspec.ops import reduce

    rng = np.random.default_rng(3)
    for shape in [(3, reduce.TWO_PASS_FROM), (2, 3, 9001), (4, 17)]:
        x = rng.standard_normal(shape).astype(np.float32)
        x[0, ..., 5] = x[0, ..., 7] = 9.0  # a tie: 5
        x[1, ..., 11] = np.nan  # a NaN (and a later one): the first
        x[1, ..., 13] = np.nan
        x[-1, ...] = -np.inf  # all -inf: 0
        if len(shape) == 2:
            x[2, 3] = np.inf
        got = jax.jit(ops.argmax)(jnp.asarray(x))
        want = jnp.argmax(jnp.asarray(x), axis=-1)
        assert got.dtype == jnp.int32 and got.shape == shape[:-1]
        np.testing.assert_array_equal(np.asarray(got), np.asarray(want))
    assert "reduce" in jax.jit(ops.argmax).lower(jnp.zeros((1, 9001))).as_text()
