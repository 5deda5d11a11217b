"""Token selection: greedy, and temperature / top-k / top-p sampling applied identically everywhere.

``Sampling`` holds ``temperature``, ``top_k``, ``top_p`` as static Python numbers (they pick the
compiled program); keys are derived per step with ``fold_in`` so a seed reproduces a run.
"""

from __future__ import annotations

import dataclasses
import numbers

import jax
import jax.numpy as jnp


def _is_real(x) -> bool:  # Python and NumPy numbers, not bools
    return isinstance(x, numbers.Real) and not isinstance(x, bool | jnp.bool_)


def check_sampling_args(temperature, top_k, top_p) -> None:
    """Python or NumPy scalars; ValueError / TypeError naming the bad one."""
    if not _is_real(temperature):
        raise TypeError(f"temperature must be a number, got {type(temperature).__name__}")
    if not float(temperature) >= 0.0 or float(temperature) == float("inf"):
        raise ValueError(f"temperature must be finite and >= 0, got {temperature}")
    if not isinstance(top_k, numbers.Integral) or isinstance(top_k, bool) or top_k < 0:
        raise ValueError(f"top_k must be an int >= 0 (0 = off), got {top_k!r}")
    if not _is_real(top_p) or not 0.0 < float(top_p) <= 1.0:
        raise ValueError(f"top_p must be in (0, 1], got {top_p!r}")


def check_seed(seed) -> int:
    """An int seed (Python or NumPy, any size) as a Python int; TypeError otherwise."""
    if not isinstance(seed, numbers.Integral) or isinstance(seed, bool):
        raise TypeError(f"seed must be an int, got {type(seed).__name__}")
    return int(seed)


def seed_key(seed: int) -> jax.Array:
    """The PRNG key of a seed. Seeds in [0, 2³²) map to ``jax.random.key(seed)``; every other int
    folds its sign and each further 32-bit word in, so distinct seeds give distinct keys (JAX's
    own ``key`` keeps only the low 32 bits of a large seed without x64)."""
    key = jax.random.key(seed % 2**32)
    if 0 <= seed < 2**32:
        return key
    key = jax.random.fold_in(key, 1 if seed < 0 else 0)
    rest = abs(seed) >> 32
    while rest:
        key = jax.random.fold_in(key, rest % 2**32)
        rest >>= 32
    return key


@dataclasses.dataclass(frozen=True)
class Sampling:
    """The sampling settings of one program (temperature 0 = greedy)."""

    temperature: float = 0.0
    top_k: int = 0
    top_p: float = 1.0

    @property
    def greedy(self) -> bool:
        return self.temperature == 0.0

    def select(self, logits: jax.Array, key) -> jax.Array:
        """Ids [...] from logits [..., V]: argmax when greedy, else a draw with ``key``."""
        return select_tokens(logits, key, self.temperature, self.top_k, self.top_p)

    def select_with_q(self, logits: jax.Array, key) -> tuple[jax.Array, jax.Array]:
        """(ids, q) for a draft: q is the distribution the id was drawn from ([..., V]), which
        lossless verification needs; an empty last axis when greedy."""
        return self.select(logits, key), draft_probs(
            logits, self.temperature, self.top_k, self.top_p
        )

    def accept(self, key, logits, drafts, q):
        """Lossless rejection sampling of ``drafts`` (see ``speculative_accept``)."""
        return speculative_accept(key, logits, drafts, q, self.temperature, self.top_k, self.top_p)


def filtered_log_probs(logits: jax.Array, temperature: float, top_k: int, top_p: float):
    """Log-probabilities [..., V] of the sampling distribution (−inf outside top-k / top-p).

    The logits are shifted by their maximum before the division, so a tiny temperature (1e-10)
    cannot overflow to inf − inf = NaN: it tends to greedy (ties shared) as it should."""
    x = logits.astype(jnp.float32)
    x = (x - jnp.max(x, axis=-1, keepdims=True)) / temperature
    if top_k and top_k < x.shape[-1]:
        kth = jax.lax.top_k(x, top_k)[0][..., -1:]
        x = jnp.where(x >= kth, x, -jnp.inf)
    if top_p < 1.0:
        sorted_x = jnp.sort(x, axis=-1)[..., ::-1]
        probs = jax.nn.softmax(sorted_x, axis=-1)
        before = jnp.cumsum(probs, axis=-1) - probs  # mass strictly above each candidate
        keep_sorted = before < top_p  # always keeps the top one
        threshold = jnp.min(jnp.where(keep_sorted, sorted_x, jnp.inf), axis=-1, keepdims=True)
        x = jnp.where(x >= threshold, x, -jnp.inf)
    return jax.nn.log_softmax(x, axis=-1)


def select_tokens(logits: jax.Array, key, temperature: float, top_k: int, top_p: float):
    """Greedy (temperature 0) or sampled ids [...] from logits [..., V]."""
    if temperature == 0.0:
        return jnp.argmax(logits, axis=-1).astype(jnp.int32)
    logp = filtered_log_probs(logits, temperature, top_k, top_p)
    return jax.random.categorical(key, logp, axis=-1).astype(jnp.int32)


def speculative_accept(
    key,
    logits: jax.Array,  # [b, k + 1, V] target logits over the window
    drafts: jax.Array,  # [b, k] drafted ids
    q: jax.Array,  # [b, k, V] the proposer's probabilities the drafts were sampled from
    temperature: float,
    top_k: int,
    top_p: float,
    *,
    residual: bool = True,
):
    """Lossless rejection sampling (Leviathan et al. 2023; Chen et al. 2023).

    Draft d_i is accepted with probability min(1, p_i(d_i) / q_i(d_i)) (as u·q < p, no division);
    a = number of leading acceptances. At the first rejection the new token is drawn from
    normalize(max(0, p_a − q_a)); when all k are accepted, from p_k (the bonus). p and q use the
    same temperature / top-k / top-p. Returns (a [b] int32, new token [b] int32).
    ``residual=False`` resamples from p_a instead: a deliberately WRONG rule, kept only as the
    statistical test's negative control.
    """
    b, k = drafts.shape
    p = jnp.exp(filtered_log_probs(logits, temperature, top_k, top_p))  # [b, k + 1, V]
    p_d = jnp.take_along_axis(p[:, :k], drafts[..., None], axis=-1)[..., 0]
    q_d = jnp.take_along_axis(q, drafts[..., None], axis=-1)[..., 0]
    k_accept, k_sample = jax.random.split(key)
    u = jax.random.uniform(k_accept, (b, k))
    accept = (u * q_d < p_d).astype(jnp.int32)
    a = jnp.sum(jnp.cumprod(accept, axis=1), axis=1).astype(jnp.int32)
    q_pad = jnp.concatenate([q, jnp.zeros_like(q[:, :1])], axis=1)  # q_k = 0: bonus draws from p_k
    p_a = jnp.take_along_axis(p, a[:, None, None], axis=1)[:, 0]
    q_a = jnp.take_along_axis(q_pad, a[:, None, None], axis=1)[:, 0]
    r = jnp.maximum(p_a - q_a, 0.0) if residual else p_a
    r = jnp.where(jnp.sum(r, axis=-1, keepdims=True) > 0, r, p_a)  # p == q exactly: never rejected
    token = jax.random.categorical(k_sample, jnp.log(r), axis=-1).astype(jnp.int32)
    return a, token


def draft_probs(logits: jax.Array, temperature: float, top_k: int, top_p: float) -> jax.Array:
    """The proposer's q for sampled drafts ([..., V]); an empty last axis when greedy."""
    if temperature == 0.0:
        return jnp.zeros(logits.shape[:-1] + (0,), jnp.float32)
    return jnp.exp(filtered_log_probs(logits, temperature, top_k, top_p))
