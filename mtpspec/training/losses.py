"""The training losses: the trunk's next-token cross-entropy and the MTP head's, at one depth or
chained over several as the proposer drafts (``decoder.mtp_chain_impl``), with the distillation
target and the agreement metrics (see ``mtpspec.training.train``)."""

from __future__ import annotations

import jax
import jax.numpy as jnp

from mtpspec.config import ModelConfig
from mtpspec.models import decoder


def depth_key(name: str, depth: int) -> str:
    """The metric ``name`` of chained depth ``depth``: ``name`` itself at depth 1, else
    ``name_d<depth>``."""
    return name if depth == 1 else f"{name}_d{depth}"


def _cross_entropy(logits, targets):
    logp = jax.nn.log_softmax(logits.astype(jnp.float32), axis=-1)
    return -jnp.mean(jnp.take_along_axis(logp, targets[..., None], axis=-1))


def losses(
    config: ModelConfig, params: dict, batch: jax.Array, *, detach_trunk: bool = False,
    mtp_depth: int = 1,
):  # fmt: skip
    """batch [b, t + 1] -> dict(main, mtp, mtp_acc, mtp_kl, mtp_agree) (nats/token; mtp_kl is
    KL(trunk's law of token i+2 || head's), mtp_agree the share of rows whose argmax agree).
    With ``mtp_depth`` d > 1 the head is also chained on its own output as the proposer drafts
    (``decoder.mtp_chain_impl``): the same four for depth j >= 2 under keys ``mtp_dj``,
    ``mtp_kl_dj``, ..., against the token (trunk's law) at i + j + 1."""
    inputs, targets = batch[:, :-1], batch[:, 1:]
    logits, hidden = decoder.forward_impl(config, params, inputs, "chunk")
    main = _cross_entropy(logits, targets)
    out = {"main": main}
    if config.mtp_num_layers:
        h = jax.lax.stop_gradient(hidden) if detach_trunk else hidden
        chain = decoder.mtp_chain_impl(config, params, h, inputs, mtp_depth)
        for d, mtp_logits in enumerate(chain, start=1):
            out[depth_key("mtp", d)] = _cross_entropy(mtp_logits, targets[:, d:])
            out[depth_key("mtp_acc", d)] = jnp.mean(jnp.argmax(mtp_logits, -1) == targets[:, d:])
            base = jax.lax.stop_gradient(logits[:, d:])  # row i + d: the trunk's law of i + d + 1
            logp_base = jax.nn.log_softmax(base.astype(jnp.float32), axis=-1)
            logq = jax.nn.log_softmax(mtp_logits.astype(jnp.float32), axis=-1)
            kl = jnp.sum(jnp.exp(logp_base) * (logp_base - logq), axis=-1)
            out[depth_key("mtp_kl", d)] = jnp.mean(kl)
            agree = jnp.argmax(mtp_logits, -1) == jnp.argmax(base, -1)
            out[depth_key("mtp_agree", d)] = jnp.mean(agree)
    return out


def mtp_loss(parts: dict, key: str, depth: int):
    """The MTP objective: ``key`` ("mtp" or "mtp_kl") averaged over the chained depths."""
    return sum(parts[depth_key(key, d)] for d in range(1, depth + 1)) / depth
