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

from mtpspec import ops
from mtpspec.decoding import adaptive
from mtpspec.decoding.sampling import filtered_log_probs, sample_rows
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
    drafts: jax.Array  # [b, R − 1] int32: the window's draft rows, breadth first
    q: jax.Array  # [b, R − 1, V] (sampled) or [b, R − 1, 0] (greedy)
    conf: Any  # [b, k] float32 in adaptive programs (chains), else None
    carry: Any  # ``step``'s carry after the last depth computed


def argmax_head(s, w, head):
    """``head`` (a ``Linear``) as a draft step's argmax (ids [b, n]), where program ``s`` and
    window ``w`` need nothing else from a draft's logits — greedy, one child per node, not
    adaptive (no confidences) — and the head is screened (``Linear.argmax``: the same ids from
    about half a bf16 head's bytes); else None."""
    one_child = all(b == 1 for b in w.branching)
    if not (s.sampling.greedy and one_child and not s.adaptive):
        return None
    if getattr(head, "screen", None) is None:
        return None
    return head.argmax


def top_b(logits, b: int):
    """The b most likely ids [..., b] (ties: the lower id first, as argmax)."""
    if b == 1:
        return ops.argmax(logits)[..., None]
    return jax.lax.top_k(logits, b)[1].astype(jnp.int32)


def children(s, draws):
    """How program ``s`` picks each node's children: ``select(logits [b, n, W], b_i, depth) ->
    (ids [b, n, b_i], q [b, n, b_i, W or 0])``, ids and the law each was drawn from. Greedy: the
    top b_i, no q. Sampled: b_i i.i.d. draws from the node's filtered distribution (keys
    ``draws.fold(depth)``), each with that q, which lossless multi-candidate verification needs;
    rows at temperature 0 take the top b_i instead, distinct, each with a one-hot q (deterministic
    candidates, equally lossless: i.i.d. draws from a one-hot q would repeat one token). For
    b_i = 1 this is exactly one draw per node (``Sampling.select_with_q``)."""
    if s.sampling.greedy:

        def greedy(logits, b: int, depth: int):
            del depth
            return top_b(logits, b), jnp.zeros(logits.shape[:-1] + (b, 0), jnp.float32)

        return greedy

    def sampled(logits, b: int, depth: int):
        keys = draws.fold(depth).keys
        logp = filtered_log_probs(logits, *draws.knobs)  # [batch, n, W]
        if b == 1:
            return sample_rows(keys, logp)[..., None], jnp.exp(logp)[:, :, None]
        shape = logp.shape[:2] + (b, logp.shape[-1])
        ids = sample_rows(keys, jnp.broadcast_to(logp[:, :, None], shape))
        q = jnp.broadcast_to(jnp.exp(logp)[:, :, None], shape)
        greedy = (draws.knobs.temperature == 0)[:, None, None]
        top = top_b(logits, b)
        ids = jnp.where(greedy, top, ids)
        q = jnp.where(greedy[..., None], jax.nn.one_hot(top, q.shape[-1], dtype=q.dtype), q)
        return ids, q

    return sampled


def per_child(q):
    """[b, n, b_i, W] -> [b, n · b_i, W] (children in breadth-first order; W may be 0)."""
    return q.reshape(q.shape[0], q.shape[1] * q.shape[2], q.shape[3])


def draft_window(
    s, w, step, draws, carry=None, budget: Budget | None = None, width: int | None = None
) -> Drafted:
    """Draft the rows of window ``w`` (``decoding.window``; a chain is the tree of ones) one
    depth at a time: ``step(i, nodes, carry) -> (logits [b, n_i, W], carry)`` gives the n_i
    nodes of depth i their children's logits (``nodes`` [b, n_i] the depth-i ids the previous
    call's logits chose, None at depth 0: the root, the pending token); each node's b_{i+1}
    children are picked by ``children(s, draws)`` (ids in [0, W): a draft vocabulary's indices
    when the step's logits are its subset; a step may give each node's greedy child itself,
    ids [b, n_i] int32, where the program is greedy, b_{i+1} = 1 and not adaptive: the
    proposer's screened head, ``argmax_head``). In adaptive programs (chains) each draft's
    confidence is kept, and with a ``budget`` the depths 1.. that no row drafts are skipped
    (``lax.cond``: zero logits, the carry unchanged; ``width``: W, default the vocabulary)."""
    width = s.config.vocab_size if width is None else width
    select = children(s, draws)
    levels, qs, confs, nodes = [], [], [], None
    for i, b_i in enumerate(w.branching):
        if budget is not None and i > 0:

            def skip(nodes, carry):
                return jnp.zeros(nodes.shape + (width,), jnp.float32), carry

            def run(nodes, carry, i=i):
                logits, carry = step(i, nodes, carry)
                return logits.astype(jnp.float32), carry

            need = budget.needs(jnp.stack(confs, axis=1), i)
            logits, carry = jax.lax.cond(need, run, skip, nodes, carry)
        else:
            logits, carry = step(i, nodes, carry)
        if s.adaptive:  # a chain's: one node per depth
            confs.append(adaptive.max_prob(logits[:, 0]))
        if jnp.issubdtype(logits.dtype, jnp.integer):  # the step's argmax ids [b, n_i] already
            ids, q = logits[..., None], jnp.zeros(logits.shape + (1, 0), jnp.float32)
        else:
            ids, q = select(logits, b_i, i)
        nodes = ids.reshape(ids.shape[0], -1)
        levels.append(nodes)
        qs.append(per_child(q))
    conf = jnp.stack(confs, axis=1) if s.adaptive else None
    return Drafted(jnp.concatenate(levels, axis=1), jnp.concatenate(qs, axis=1), conf, carry)


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
