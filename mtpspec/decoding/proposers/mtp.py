"""The model's own MTP head as proposer.

The MTP module's row i pairs the target's final-normed hidden h_i with the token at i + 1 and
predicts the token at i + 2. Its KV cache lives in the target's ``DecodeState`` (``state.mtp``,
one row behind the target once caught up).

  init / update  fold the newly accepted rows (hidden of window row j + the token after it) into
                 the MTP cache; keep the MTP hidden of the last one (row n − 1 pairs the last
                 accepted hidden with the newly emitted token: it predicts draft 1)
  propose        the window's rows depth by depth: depth 1 from that hidden through the shared
                 LM head; deeper rows chain the MTP module on its own output hidden along their
                 branch (vLLM's rule; a chain is the tree of ones, ``SpecConfig.tree`` any
                 other); with a draft vocabulary (``SpecConfig.draft_vocab``) every draft's LM
                 head is the subset's rows (``DraftHead``) and q is scattered back onto the full
                 vocabulary
"""

from __future__ import annotations

import dataclasses
from typing import ClassVar, NamedTuple

import jax
import jax.numpy as jnp

from mtpspec.decoding import window
from mtpspec.decoding.proposers import base
from mtpspec.decoding.proposers.base import Committed, Prefilled, Proposal, Proposer, register
from mtpspec.models import inference
from mtpspec.models.decoder import lm_logits, mtp_window_hidden_impl
from mtpspec.models.mtp_tree import mtp_rows


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
    if head.impl == linear:
        return DraftHead(idx, head.subset(idx))
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
        """The window's rows depth by depth (``base.draft_window``): every node's children from
        the LM head (or the draft vocabulary's rows, ``DraftHead``) on the MTP hidden that
        predicts them; a node of depth i < d gets one MTP row pairing its predictor's hidden with
        its token. A chain's rows are written into the MTP cache past its length (never read: the
        next fold writes over them; no copy of the cache per step); a tree's rows attend to the
        cache's prefix plus their own ancestors' rows (``models.mtp_tree``), nothing written."""
        w = window.window(s)
        dh: DraftHead | None = pparams
        if dh is None:
            head, width = (lambda h: lm_logits(s.config, params, h)), None
        else:
            head, width = dh.head, dh.ids.shape[0]
        # a greedy chain's drafts through the head's screen: the same ids
        head = base.argmax_head(s, w, params.get("lm_head") if dh is None else dh.head) or head

        def token(nodes):  # the ids the head's logits index, as vocabulary ids
            return nodes if dh is None else dh.ids[nodes]

        if w.is_chain:
            one = jnp.ones_like(state.lengths)

            def step(i, nodes, carry):  # carry: (hidden, MTP cache, MTP lengths)
                h, mtp, mtp_lengths = carry
                if i > 0:
                    tmp = state._replace(mtp=mtp, mtp_lengths=mtp_lengths)
                    h, tmp = mtp_window_hidden_impl(s.config, params, tmp, h, token(nodes), one)
                    mtp, mtp_lengths = tmp.mtp, tmp.mtp_lengths
                return head(h), (h, mtp, mtp_lengths)

            carry = (pstate.hidden, state.mtp, state.mtp_lengths)
        else:

            def step(i, nodes, carry):  # carry: (hidden of each node's predictor, own keys)
                hid, own = carry
                if i > 0:
                    parent_hidden = jnp.repeat(hid, w.branching[i - 1], axis=1)
                    if own is not None:  # the ancestors' keys, repeated for each child
                        own = tuple(jnp.repeat(x, w.branching[i - 1], axis=1) for x in own)
                    position = state.mtp_lengths + (i - 1)
                    hid, own = mtp_rows(
                        s.config, params, state, parent_hidden, token(nodes), position, own
                    )
                return head(hid), (hid, own)

            carry = (pstate.hidden, None)
        out = base.draft_window(s, w, step, key, carry, budget, width)
        drafts, q = token(out.drafts), out.q
        if dh is not None:
            q = scatter_q(q, dh.ids, s.config.vocab_size)
        written = state._replace(mtp=out.carry[1]) if w.is_chain else None
        return Proposal(drafts, q, state=written, conf=out.conf)

    def update(self, s, params, pparams, pstate, scratch, done: Committed, key):
        return self._fold(s, params, done.state, done.hidden, done.emitted, done.n)
