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

from mtpspec.models.state import DecodeState


class Prefilled(NamedTuple):
    """What ``init`` sees after the prompt forward."""

    prompts: jax.Array  # [b, p] int32, right-padded
    lengths: jax.Array  # [b] int32 true prompt lengths
    first: jax.Array  # [b] int32 the first generated token (pending: not yet in the state)
    hidden: jax.Array  # [b, p, H] target final-normed hidden over the prompt
    state: DecodeState  # the target after the prompt


class Proposal(NamedTuple):
    """k drafts per sequence and what verification needs of them. With a tree (``s.tree``,
    R rows): drafts [b, R − 1] for rows 1.. in breadth-first order and q [b, R, V or 0] with a
    row per window row (the root's unused)."""

    drafts: jax.Array  # [b, k] int32 (any valid ids for inactive sequences)
    q: jax.Array  # [b, k, V]: the distribution each draft was drawn from; [b, k, 0] when greedy
    scratch: Any = None  # handed to ``update`` in the same step (not carried across steps)
    # the decode state to verify from when drafting wrote into its caches (None: the step's own).
    # Only slots past the committed lengths may differ (never read; the next write there replaces
    # them): keeping them saves the copy a throw-away cache would cost every step
    state: Any = None


class Committed(NamedTuple):
    """What ``update`` sees after the target committed the verify window [pending, d_1..d_k]."""

    state: DecodeState  # the target holding exactly the accepted prefix (lengths = before + n)
    hidden: jax.Array  # [b, k + 1, H] target final-normed hidden of every window row
    emitted: jax.Array  # [b, k + 1] the token after each row: d_1..d_a, then the new token
    n: jax.Array  # [b] int32 rows kept (a + 1; 0 for finished sequences)
    node: jax.Array | None = None  # [b] the accepted tree row (tree speculation), else None


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

    def propose(self, s, params, pparams, pstate, state, pending, active, key) -> Proposal:
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


def select_drafts(s, logits_fn, draws, k: int):
    """Draft k tokens one at a time: ``logits_fn(i, previous ids or None) -> logits [b, V]``;
    draft i is drawn with ``draws.fold(i)`` at each row's sampling settings. Returns
    (drafts [b, k], q [b, k, V or 0])."""
    picked = []
    for i in range(k):
        logits = logits_fn(i, picked[-1][0] if picked else None)
        picked.append(s.sampling.select_with_q(logits, draws.fold(i)))
    drafts = jnp.stack([d for d, _ in picked], axis=1)
    q = jnp.stack([q for _, q in picked], axis=1)
    return drafts, q


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
