"""The model's own MTP head as proposer.

The MTP module's row i pairs the target's final-normed hidden h_i with the token at i + 1 and
predicts the token at i + 2. Its KV cache lives in the target's ``DecodeState`` (``state.mtp``,
one row behind the target once caught up).

  init / update  fold the newly accepted rows (hidden of window row j + the token after it) into
                 the MTP cache; keep the MTP hidden of the last one (row n − 1 pairs the last
                 accepted hidden with the newly emitted token: it predicts draft 1)
  propose        draft 1 from that hidden through the shared LM head; drafts 2..k chain the MTP
                 module on its own output hidden (vLLM's rule) on a throw-away copy of the cache;
                 with a tree (``SpecConfig.tree``), the top-b_i children of every node, chained
                 along each branch (``models.mtp_tree``); with a draft vocabulary
                 (``SpecConfig.draft_vocab``) every draft's LM head is the subset's rows
                 (``DraftHead``) and q is scattered back onto the full vocabulary
"""

from __future__ import annotations

import dataclasses
from typing import ClassVar, NamedTuple

import jax
import jax.numpy as jnp

from mtpspec.decoding.proposers import base
from mtpspec.decoding.proposers.base import Committed, Prefilled, Proposal, Proposer, register
from mtpspec.decoding.sampling import draft_probs, sample_rows
from mtpspec.models import inference
from mtpspec.models.decoder import lm_logits, mtp_window_hidden_impl, mtp_window_step_impl
from mtpspec.models.mtp_tree import greedy_select, mtp_tree_drafts, top_b


class MTPState(NamedTuple):
    hidden: jax.Array  # [b, 1, H] MTP output hidden of the last folded-in row


class DraftHead(NamedTuple):
    """The LM head restricted to a draft vocabulary: ``ids`` [N] int32 and their rows of the
    head as a ``Linear`` [H -> N] (made once per weights and vocabulary: ``inference.MEMO``)."""

    ids: jax.Array
    head: inference.Linear


def draft_head(head: inference.Linear, ids, linear: str) -> DraftHead:
    """The subset of a decoding tree's LM head ``head`` (its columns ``ids``, in the head's
    stored dtype) for a resolved linear implementation."""
    idx = jnp.asarray(ids, jnp.int32)
    return DraftHead(idx, inference.Linear.of(head.columns(idx), linear))


def scatter_q(q: jax.Array, ids: jax.Array, vocab: int) -> jax.Array:
    """The draft distribution over the subset [..., N] as one over the vocabulary [..., V]
    (zero outside the subset); greedy's empty q stays empty."""
    if q.shape[-1] == 0:
        return q
    return jnp.zeros(q.shape[:-1] + (vocab,), q.dtype).at[..., ids].set(q)


@register
@dataclasses.dataclass(frozen=True)
class MTPProposer(Proposer):
    name: ClassVar[str] = "mtp"
    vocab_size: int = 0  # the draft vocabulary's size (part of the program); 0: the full head

    @classmethod
    def check(cls, spec, config, params) -> None:
        if not config.mtp_num_layers or "mtp" not in params:
            raise ValueError("proposer='mtp' needs a model with an MTP head (mtp.* weights)")

    @classmethod
    def from_spec(cls, spec) -> MTPProposer:
        return cls(spec.draft_vocab.size if spec.draft_vocab is not None else 0)

    def device_params(self, spec, s, params):
        if spec.draft_vocab is None:
            return None
        dv = spec.draft_vocab
        if s.mesh is None:  # the decoding tree's head (built once, shared with the target)
            head = inference.MEMO.get(s.config, params, s.backend.linear)["lm_head"]
        else:  # under a mesh the canonical tree runs
            head = inference.canonical_head(s.config, params)
        linear = s.backend.linear
        return inference.MEMO.cached(
            ("draft_head", s.config, dv, linear), head, lambda: draft_head(head, dv.ids, linear)
        )

    def shard_params(self, pparams, mesh):
        from jax.sharding import NamedSharding, PartitionSpec

        return jax.device_put(pparams, NamedSharding(mesh, PartitionSpec()))

    def _fold(self, s, params, state, hidden, next_tokens, n):
        y, state = mtp_window_hidden_impl(s.config, params, state, hidden, next_tokens, n)
        row = jnp.clip(n - 1, 0, hidden.shape[1] - 1)[:, None, None]
        return MTPState(jnp.take_along_axis(y, row, axis=1)), state

    def init(self, s, params, pparams, pre: Prefilled, key):
        p = pre.prompts.shape[1]
        nxt = jnp.concatenate([pre.prompts[:, 1:], pre.prompts[:, :1]], axis=1)
        nxt = jnp.where(jnp.arange(p)[None] == (pre.lengths - 1)[:, None], pre.first[:, None], nxt)
        return self._fold(s, params, pre.state, pre.hidden, nxt, pre.lengths)

    def propose(
        self, s, params, pparams, pstate, state, pending, active, key, budget=None
    ) -> Proposal:
        if s.tree is not None:  # b_i children per node, chained along every branch
            select = greedy_select if s.sampling.greedy else sampled_children(key)
            drafts, q = mtp_tree_drafts(s.config, params, state, pstate.hidden, s.tree, select)
            return Proposal(drafts, q)
        if self.vocab_size:
            return self._propose_in_vocab(s, params, pparams, pstate, state, key, budget)
        one = jnp.ones_like(state.lengths)

        def step(i, previous, carry):  # carry: (hidden, MTP cache, MTP lengths)
            h, mtp, mtp_lengths = carry
            if i == 0:
                return lm_logits(s.config, params, h)[:, 0], carry
            tmp = state._replace(mtp=mtp, mtp_lengths=mtp_lengths)
            logits, h, tmp = mtp_window_step_impl(s.config, params, tmp, h, previous[:, None], one)
            return logits[:, 0], (h, tmp.mtp, tmp.mtp_lengths)

        carry = (pstate.hidden, state.mtp, state.mtp_lengths)
        out = base.select_drafts(s, step, key, s.k, carry, budget)
        # the chained drafts' rows stay in the MTP cache past its length (never read; the next
        # fold writes over them): no copy of the cache per step
        mtp = out.carry[1]
        return Proposal(out.drafts, out.q, state=state._replace(mtp=mtp), conf=out.conf)

    def _propose_in_vocab(self, s, params, dh: DraftHead, pstate, state, key, budget) -> Proposal:
        """The chain with every draft chosen among ``dh.ids`` (logits of the subset head only);
        the chain feeds each draft's full-vocabulary id to the next MTP step."""
        one = jnp.ones_like(state.lengths)

        def step(i, previous, carry):  # carry: (hidden, MTP cache, MTP lengths)
            h, mtp, mtp_lengths = carry
            if i > 0:
                token = dh.ids[previous][:, None]
                tmp = state._replace(mtp=mtp, mtp_lengths=mtp_lengths)
                h, tmp = mtp_window_hidden_impl(s.config, params, tmp, h, token, one)
                mtp, mtp_lengths = tmp.mtp, tmp.mtp_lengths
            return dh.head(h)[:, 0], (h, mtp, mtp_lengths)

        carry = (pstate.hidden, state.mtp, state.mtp_lengths)
        width = dh.ids.shape[0]
        out = base.select_drafts(s, step, key, s.k, carry, budget, width)
        drafts = dh.ids[out.drafts]
        q = scatter_q(out.q, dh.ids, s.config.vocab_size)
        mtp = out.carry[1]
        return Proposal(drafts, q, state=state._replace(mtp=mtp), conf=out.conf)

    def update(self, s, params, pparams, pstate, scratch, done: Committed, key):
        return self._fold(s, params, done.state, done.hidden, done.emitted, done.n)


def sampled_children(draws):
    """``select`` for sampled trees: b children drawn i.i.d. from each node's filtered MTP
    distribution q, each with q (what lossless multi-candidate verification needs). Rows at
    temperature 0 take the top b instead, distinct, each with a one-hot q (deterministic
    candidates, equally lossless): i.i.d. draws from their one-hot q would repeat one token."""

    def select(logits, b: int, depth: int):
        q = draft_probs(logits, *draws.knobs)  # [batch, n, V]
        shape = q.shape[:2] + (b, q.shape[-1])
        ids = sample_rows(draws.fold(depth).keys, jnp.log(jnp.broadcast_to(q[:, :, None], shape)))
        q = jnp.broadcast_to(q[:, :, None], shape)
        greedy = (draws.knobs.temperature == 0)[:, None, None]
        top = top_b(logits, b)
        ids = jnp.where(greedy, top, ids)
        q = jnp.where(greedy[..., None], jax.nn.one_hot(top, q.shape[-1], dtype=q.dtype), q)
        return ids, q

    return select
