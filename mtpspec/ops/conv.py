"""Causal depthwise conv1d (optionally followed by SiLU), as in a GDN layer's short convolution.

Convention (PyTorch ``Conv1d(groups=c, padding=w-1)`` truncated to the first t outputs): with the
window holding the last w−1 *pre-conv* inputs, xp = [window ‖ x] and
    y_t[c] = act(Σ_{i<w} weight[c, i] · xp[t + i, c] + bias[c])
so weight[:, w−1] multiplies the current token. The window after the sequence is the last w−1 rows
of xp. Shape letters: b batch, t time, c channels, w kernel width.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np

_ACTIVATIONS = (None, "silu")


def _check(x, weight, window, activation, x_rank):
    if activation not in _ACTIVATIONS:
        raise ValueError(f"activation must be one of {_ACTIVATIONS}, got {activation!r}")
    if x.ndim != x_rank:
        raise ValueError(f"x must have rank {x_rank}, got shape {x.shape}")
    for name, a in (("x", x), ("weight", weight), ("window", window)):
        if a is not None and not jnp.issubdtype(a.dtype, jnp.floating):
            raise TypeError(f"{name} must be a floating-point array, got {a.dtype}")
    if weight.ndim != 2 or weight.shape[0] != x.shape[-1]:
        raise ValueError(f"weight must be [channels={x.shape[-1]}, width], got {weight.shape}")
    w = weight.shape[1]
    if w < 1:
        raise ValueError(f"conv width must be >= 1, got weight shape {weight.shape}")
    expected = (x.shape[0], w - 1, x.shape[-1])
    if window is not None and tuple(window.shape) != expected:
        raise ValueError(f"conv window must have shape {expected}, got {window.shape}")


def _apply(xp, weight, bias, activation, t):
    """xp [b, t + w − 1, c] -> y [b, t, c] float32."""
    w = weight.shape[1]
    wf = weight.astype(jnp.float32)
    xf = xp.astype(jnp.float32)
    y = sum(wf[:, i] * xf[:, i : i + t] for i in range(w))
    if bias is not None:
        y = y + bias.astype(jnp.float32)
    if activation == "silu":
        y = jax.nn.silu(y)
    return y


def causal_conv1d(
    x: jax.Array,  # [b, t, c]
    weight: jax.Array,  # [c, w]
    bias: jax.Array | None = None,  # [c]
    *,
    initial_window: jax.Array | None = None,  # [b, w − 1, c] pre-conv inputs; zeros if None
    activation: str | None = "silu",
) -> tuple[jax.Array, jax.Array]:
    """Whole-sequence causal conv; returns (y [b, t, c] in x's dtype, new window [b, w − 1, c])."""
    _check(x, weight, initial_window, activation, 3)
    b, t, c = x.shape
    w = weight.shape[1]
    if initial_window is None:
        initial_window = jnp.zeros((b, w - 1, c), x.dtype)
    xp = jnp.concatenate([initial_window.astype(x.dtype), x], axis=1)
    y = _apply(xp, weight, bias, activation, t)
    return y.astype(x.dtype), xp[:, xp.shape[1] - (w - 1) :]


def causal_conv1d_step(
    x: jax.Array,  # [b, c], one new token
    window: jax.Array,  # [b, w − 1, c]
    weight: jax.Array,  # [c, w]
    bias: jax.Array | None = None,  # [c]
    *,
    activation: str | None = "silu",
) -> tuple[jax.Array, jax.Array]:
    """Rolling one-token update; returns (y [b, c] in x's dtype, new window [b, w − 1, c])."""
    _check(x, weight, window, activation, 2)
    y, new_window = causal_conv1d(
        x[:, None], weight, bias, initial_window=window, activation=activation
    )
    return y[:, 0], new_window


def conv_window_after(
    window: jax.Array,  # [b, w − 1, c] before the window of tokens
    x: jax.Array,  # [b, t, c] pre-conv inputs of the window
    n: jax.Array,  # [b] int in 0..t: positions to keep
) -> jax.Array:  # [b, w − 1, c]
    """The conv window after only the first ``n`` of ``x``'s positions (speculative commit).

    A slice of [window ‖ x] at offset n, per sequence; static shapes.
    """
    if x.ndim != 3 or window.ndim != 3 or window.shape[::2] != x.shape[::2]:
        raise ValueError(f"window {window.shape} and x {x.shape} must be [b, *, c] alike")
    xp = jnp.concatenate([window.astype(x.dtype), x], axis=1)
    width = window.shape[1]
    check_counts(n, x.shape[0], x.shape[1])
    n = jnp.asarray(n, jnp.int32).reshape(x.shape[0])

    def one(row, start):
        return jax.lax.dynamic_slice_in_dim(row, start, width, axis=0)

    return jax.vmap(one)(xp, n)


def check_counts(n, batch: int, t: int, name: str = "n") -> None:
    """``n`` [batch] must be integers in 0..t: checked when concrete (a traced ``n`` inside a
    jitted program is the caller's to bound), ValueError naming the first bad one."""
    if isinstance(n, jax.core.Tracer):
        return
    values = np.asarray(n)
    if not np.issubdtype(values.dtype, np.integer):
        raise TypeError(f"{name} must be integers, got {values.dtype}")
    if values.size != batch:
        raise ValueError(f"{name} must hold {batch} counts (one per sequence), got {values.shape}")
    bad = values[(values < 0) | (values > t)]
    if bad.size:
        raise ValueError(f"{name} must be in 0..{t} (the window length), got {int(bad[0])}")


def causal_conv1d_tree(
    x: jax.Array,  # [b, R, c] pre-conv inputs of the tree's rows
    weight: jax.Array,  # [c, w]
    window: jax.Array,  # [b, w − 1, c] the last w − 1 inputs before the root
    taps,  # [R, w] int (static): row r's tap i reads [window ‖ x][taps[r, i]]
    *,
    activation: str | None = "silu",
) -> jax.Array:  # [b, R, c] in x's dtype
    """The causal conv of every tree row over its own root-to-row path (``TreeShape.conv_taps``):
    row r's output is what ``causal_conv1d`` gives at the last position of its path."""
    _check(x, weight, window, activation, 3)
    xp = jnp.concatenate([window.astype(x.dtype), x], axis=1).astype(jnp.float32)
    taps = np.asarray(taps)
    wf = weight.astype(jnp.float32)
    y = sum(wf[:, i] * xp[:, taps[:, i]] for i in range(weight.shape[1]))
    if activation == "silu":
        y = jax.nn.silu(y)
    return y.astype(x.dtype)
