"""The proposer protocol and its registry.

A proposer is a frozen dataclass (hashable: it is part of the compiled program's key, so its
fields are static options such as n-gram sizes or the draft model's config). The decoding program
calls, inside one jitted ``lax.while_loop``:

    pstate, state = proposer.init(s, params, pparams, Prefilled(...), key)          # after prefill
    loop:
        proposal = proposer.propose(s, params, pparams, pstate, state, pending, active, key)
        ... verify [pending, proposal.drafts], accept, commit, emit ...
        pstate, state = proposer.update(s, params, pparams, pstate, proposal.scratch,
                                        Committed(...), key)

``s`` is the program key (``decoding.program.ProgramKey``: config, k, sampling mode, commit
strategy, capacity, mesh); ``key`` the rows' randomness (``sampling.Draws``: a key per row and the
rows' sampling settings; ``key.fold(i)`` derives sub-keys); ``params`` the target's weights;
``pparams`` the proposer's own device arguments (``device_params``: the draft model's weights,
else None); ``pstate`` any pytree of per-sequence arrays with a fixed structure (it is part of the
loop carry). ``state`` is the target's ``DecodeState``: a proposer may read it and, in ``init`` /
``update``, return it changed (the MTP head's KV cache lives there); it must never change what the
target model reads.

Host-side, before any device work: ``check(spec, config, params)`` raises ValueError / TypeError
for settings this proposer cannot run.
"""

from __future__ import annotations

import dataclasses
from typing import Any, ClassVar, NamedTuple

import jax
import jax.numpy as jnp

from mtpspec.decoding import adaptive
from mtpspec.models.state import DecodeState


class Prefilled(NamedTuple):
    """What ``init`` sees after the prompt forward."""

    prompts: jax.Array  # [b, p] int32, right-padded
    lengths: jax.Array  # [b] int32 true prompt lengths
    first: jax.Array  # [b] int32 the first generated token (pending: not yet in the state)
    hidden: jax.Array  # [b, p, H] target final-normed hidden over the prompt
    state: DecodeState  # the target after the prompt


class Proposal(NamedTuple):
    """The draft rows of the verify window (``decoding.window``: rows 1..R − 1 after the pending
    token; a chain's k drafts in order, a tree's nodes breadth first) and what verification needs
    of them."""

    drafts: jax.Array  # [b, R − 1] int32 (any valid ids for inactive sequences)
    q: jax.Array  # [b, R − 1, V]: the law each draft was drawn from; [b, R − 1, 0] when greedy
    scratch: Any = None  # handed to ``update`` in the same step (not carried across steps)
    # the decode state to verify from when drafting wrote into its caches (None: the step's own).
    # Only slots past the committed lengths may differ (never read; the next write there replaces
    # them): keeping them saves the copy a throw-away cache would cost every step
    state: Any = None
    # [b, k] float32: the largest probability of the distribution each draft was chosen from
    # (the model's own softmax, temperature 1), what ``SpecConfig.p_min`` cuts on; set in
    # adaptive programs (``s.adaptive``) by proposers that have probabilities, else None
    conf: Any = None


class Budget(NamedTuple):
    """What an adaptive program lets each row draft this step (``decoding.adaptive``): a row
    drafts position i while i < k_cap and every confidence up to i is ≥ p_min. A proposer may
    skip work no row needs; it still returns [b, k] drafts (ignored past each row's count)."""

    p_min: jax.Array  # [] float32
    k_cap: jax.Array  # [b] int32
    active: jax.Array  # [b] bool

    def needs(self, conf_before: jax.Array, i: int) -> jax.Array:
        """[] bool: does any row draft position i, given the confidences of positions < i?"""
        ok = jnp.all(conf_before[:, :i] >= self.p_min, axis=1)
        return jnp.any(self.active & ok & (i < self.k_cap))


class Committed(NamedTuple):
    """What ``update`` sees after the target committed the verify window [pending, d_1..d_k]."""

    state: DecodeState  # the target holding exactly the accepted prefix (lengths = before + n)
    hidden: jax.Array  # [b, k + 1, H] target final-normed hidden of every window row
    emitted: jax.Array  # [b, k + 1] the token after each row: d_1..d_a, then the new token
    n: jax.Array  # [b] int32 rows kept (a + 1; 0 for finished sequences)
    node: jax.Array | None = None  # [b] the accepted window row (a chain's: its accepted count)


@dataclasses.dataclass(frozen=True)
class Proposer:
    """Base class: subclass as a frozen dataclass, set ``name``, implement ``init``, ``propose``
    and ``update``, decorate with ``@register``."""

    name: ClassVar[str] = ""

    # ---- host side ------------------------------------------------------------------------------

    @classmethod
    def check(cls, spec, config, params) -> None:
        """Raise ValueError / TypeError for settings this proposer cannot run."""

    @classmethod
    def from_spec(cls, spec) -> Proposer:
        """The (hashable) instance for a validated ``SpecConfig``."""
        return cls()

    def device_params(self, spec, s, params) -> Any:
        """The proposer's own traced arguments (weights), or None, for the validated ``spec``,
        the program key ``s`` and the target's ``params`` as the caller passed them (a
        canonical tree or ``DecodingWeights``)."""
        return None

    def shard_params(self, pparams, mesh) -> Any:
        """``device_params`` placed on ``mesh``."""
        return pparams

    # ---- device side ----------------------------------------------------------------------------

    def init(self, s, params, pparams, pre: Prefilled, key) -> tuple[Any, DecodeState]:
        raise NotImplementedError

    def propose(
        self, s, params, pparams, pstate, state, pending, active, key, budget=None
    ) -> Proposal:
        """k drafts per row. ``budget`` (adaptive programs only, else None): a ``Budget``; a
        proposer may use it to skip drafts no row needs, and sets ``Proposal.conf`` where it
        has probabilities."""
        raise NotImplementedError

    def update(self, s, params, pparams, pstate, scratch, done: Committed, key):
        raise NotImplementedError

    def constrain(self, s, pstate, mesh) -> Any:
        """Under a mesh, pin ``pstate``'s layout; default: every leaf batch-on-``data``."""
        from mtpspec import sharding

        return jax.tree.map(
            lambda x: jax.lax.with_sharding_constraint(x, sharding.batch_sharding(mesh, x.ndim)),
            pstate,
        )


class Drafted(NamedTuple):
    drafts: jax.Array  # [b, k] int32
    q: jax.Array  # [b, k, V] (sampled) or [b, k, 0] (greedy)
    conf: Any  # [b, k] float32 in adaptive programs, else None
    carry: Any  # ``step``'s carry after the last draft computed


def select_drafts(
    s, step, draws, k: int, carry=None, budget: Budget | None = None, width: int | None = None
) -> Drafted:
    """Draft k tokens one at a time: ``step(i, previous ids or None, carry) -> (logits [b, V],
    carry)``; draft i is drawn with ``draws.fold(i)`` at each row's sampling settings. In
    adaptive programs (``s.adaptive``) each draft's confidence is kept, and with a ``budget``
    the steps of positions 1.. that no row drafts are skipped (``lax.cond``: zero logits, the
    carry unchanged; ``width``: the logits' last axis, default the vocabulary)."""
    width = s.config.vocab_size if width is None else width
    picked, confs = [], []
    for i in range(k):
        previous = picked[-1][0] if picked else None
        if budget is not None and i > 0:

            def skip(previous, carry):
                return jnp.zeros((previous.shape[0], width), jnp.float32), carry

            def run(previous, carry, i=i):
                logits, carry = step(i, previous, carry)
                return logits.astype(jnp.float32), carry

            need = budget.needs(jnp.stack(confs, axis=1), i)
            logits, carry = jax.lax.cond(need, run, skip, previous, carry)
        else:
            logits, carry = step(i, previous, carry)
        if s.adaptive:
            confs.append(adaptive.max_prob(logits))
        picked.append(s.sampling.select_with_q(logits, draws.fold(i)))
    drafts = jnp.stack([d for d, _ in picked], axis=1)
    q = jnp.stack([q for _, q in picked], axis=1)
    conf = jnp.stack(confs, axis=1) if s.adaptive else None
    return Drafted(drafts, q, conf, carry)


_REGISTRY: dict[str, type[Proposer]] = {}


def register(cls: type[Proposer]) -> type[Proposer]:
    """Class decorator: make ``cls`` available as ``SpecConfig(proposer=cls.name)``."""
    if not cls.name:
        raise ValueError(f"{cls.__name__} must set a non-empty class attribute 'name'")
    if cls.name in _REGISTRY and _REGISTRY[cls.name] is not cls:
        raise ValueError(f"a proposer named {cls.name!r} is already registered")
    _REGISTRY[cls.name] = cls
    return cls


def lookup(name: str) -> type[Proposer]:
    if name not in _REGISTRY:
        raise ValueError(f"unknown proposer {name!r}; expected one of {names()}")
    return _REGISTRY[name]


def names() -> tuple[str, ...]:
    return tuple(sorted(_REGISTRY))
