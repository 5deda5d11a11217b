"""A separate (smaller) mtpspec model as proposer: any hybrid or attention-only model sharing the
target's vocabulary (``SpecConfig(proposer="draft", draft_config=..., draft_params=...)``).

Its decode state holds every emitted token but the pending one, like the target's. ``propose``
drafts the window's rows depth by depth and hands their commit data to ``update``, which commits
the draft state to the accepted row's path with the same strategy as the target
(``commit_window``): a chain as k + 1 one-token steps over [pending, d_1..d_k] (so that an
all-accepted window is folded in too), a tree through its own tree windows.
"""

from __future__ import annotations

import dataclasses
from typing import ClassVar

import jax.numpy as jnp

from mtpspec import sharding
from mtpspec.config import ModelConfig
from mtpspec.decoding import window
from mtpspec.decoding.commit import commit_window
from mtpspec.decoding.proposers import base
from mtpspec.decoding.proposers.base import Committed, Prefilled, Proposal, Proposer, register
from mtpspec.models.decoder import window_step_impl
from mtpspec.models.inference import check_finite_once
from mtpspec.models.params import check_param_tree
from mtpspec.models.state import GDNCommit, init_decode_state
from mtpspec.ops import GDNAux


def stack_commits(steps: list[tuple]) -> tuple:
    """Per-layer commit data of t one-token passes, joined as if from one t-token window."""
    joined = []
    for per_layer in zip(*steps, strict=True):
        if not isinstance(per_layer[0], GDNCommit):
            joined.append(per_layer[0])
            continue
        cat = {
            f: jnp.concatenate([getattr(c, f) for c in per_layer], axis=1)
            for f in ("conv_in", "k", "v", "g", "beta")
        }
        states = per_layer[0].aux.states
        aux = GDNAux(
            u=jnp.concatenate([c.aux.u for c in per_layer], axis=1),
            g_cum=jnp.cumsum(cat["g"], axis=1),
            states=None
            if states is None
            else jnp.concatenate([c.aux.states for c in per_layer], axis=1),
        )
        joined.append(GDNCommit(aux=aux, **cat))
    return tuple(joined)


@register
@dataclasses.dataclass(frozen=True)
class DraftModelProposer(Proposer):
    name: ClassVar[str] = "draft"
    config: ModelConfig | None = None  # the draft model's

    @classmethod
    def check(cls, spec, config, params) -> None:
        if not isinstance(spec.draft_config, ModelConfig) or spec.draft_params is None:
            raise ValueError("proposer='draft' needs draft_config (a ModelConfig) and draft_params")
        if spec.draft_config.vocab_size != config.vocab_size:
            raise ValueError(
                f"draft model vocabulary ({spec.draft_config.vocab_size}) differs from the "
                f"target's ({config.vocab_size})"
            )
        check_param_tree(spec.draft_config, spec.draft_params, name="draft_params")
        try:  # NaN draft weights would propose garbage silently (once per parameter set)
            check_finite_once(spec.draft_params)
        except ValueError as e:
            raise ValueError(f"draft_params: {e}") from e

    @classmethod
    def from_spec(cls, spec) -> DraftModelProposer:
        return cls(spec.draft_config)

    def device_params(self, spec, s, params):
        return spec.draft_params

    def shard_params(self, pparams, mesh):
        return sharding.shard_params(self.config, pparams, mesh)

    def init(self, s, params, pparams, pre: Prefilled, key):
        b = pre.prompts.shape[0]
        dstate = init_decode_state(self.config, b, s.capacity)
        out = window_step_impl(
            self.config, pparams, dstate, pre.prompts, pre.lengths, s.backend.prefill
        )
        return out.state, pre.state

    def propose(
        self, s, params, pparams, pstate, state, pending, active, key, budget=None
    ) -> Proposal:
        """The window's rows depth by depth (``base.draft_window``; every depth runs, so the
        commit data of every row is kept for ``update``). A chain steps the draft model one
        token at a time (the pending token, then each draft) and folds the last draft in too (an
        all-accepted window keeps it); a tree runs a tree window over the rows known so far
        (deeper rows hold placeholders, which no shallower row sees) per depth and a last one
        over the whole tree."""
        w = window.window(s)
        if w.is_chain:
            valid = active.astype(jnp.int32)
            keep_states = s.commit == "states"
            commits = []

            def one(dstate, token):
                out = window_step_impl(
                    self.config, pparams, dstate, token[:, None], valid, "recurrent", keep_states
                )
                commits.append(out.commit)
                return out

            def step(i, nodes, dstate):
                out = one(dstate, pending if nodes is None else nodes[:, 0])
                return out.logits, out.state

            drafted = base.draft_window(s, w, step, key, pstate)
            last = one(drafted.carry, drafted.drafts[:, -1])
            scratch = (last.state, stack_commits(commits))
            return Proposal(drafted.drafts, drafted.q, scratch=scratch, conf=drafted.conf)

        valid = jnp.where(active, w.rows, 0).astype(jnp.int32)

        def tree_window(tokens):
            return window_step_impl(self.config, pparams, pstate, tokens, valid, "auto", tree=w)

        def step(i, nodes, tokens):
            lo, hi = w.levels[i]
            if nodes is not None:
                tokens = tokens.at[:, lo:hi].set(nodes)
            return tree_window(tokens).logits[:, lo:hi], tokens

        tokens = jnp.zeros((pending.shape[0], w.rows), jnp.int32).at[:, 0].set(pending)
        drafted = base.draft_window(s, w, step, key, tokens)
        out = tree_window(jnp.concatenate([pending[:, None], drafted.drafts], axis=1))
        return Proposal(drafted.drafts, drafted.q, scratch=(out.state, out.commit))

    def update(self, s, params, pparams, pstate, scratch, done: Committed, key):
        after, commits = scratch
        rows = window.kept_rows(window.window(s), done.node)  # the path of a tree's node
        return commit_window(pstate, after, commits, done.n, s.commit, rows=rows), done.state

    def constrain(self, s, pstate, mesh):
        return sharding.constrain_state(self.config, pstate, mesh)
