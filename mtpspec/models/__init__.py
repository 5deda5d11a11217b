"""Models: parameters, layers, the hybrid decoder, its MTP head and the decode state.

logits = models.forward(config, params, tokens)          # [b, t] int32 -> [b, t, V] f32
out = models.prefill(config, params, tokens, lengths, capacity=n)
out = models.step(config, params, out.state, next_tokens)
out = models.window_step(config, params, state, window_tokens, valid)
"""

from mtpspec.models.decoder import (
    StepOutput,
    check_tokens,
    forward,
    forward_hidden,
    forward_impl,
    lm_logits,
    mtp_forward,
    mtp_window_step,
    prefill,
    step,
    window_step,
)
from mtpspec.models.params import check_param_tree, init_params, param_shapes
from mtpspec.models.state import (
    AttentionCache,
    AttentionCommit,
    DecodeState,
    GDNCache,
    GDNCommit,
    init_decode_state,
)

__all__ = [
    "AttentionCache",
    "AttentionCommit",
    "DecodeState",
    "GDNCache",
    "GDNCommit",
    "StepOutput",
    "check_param_tree",
    "check_tokens",
    "forward",
    "forward_hidden",
    "forward_impl",
    "init_decode_state",
    "init_params",
    "lm_logits",
    "mtp_forward",
    "mtp_window_step",
    "param_shapes",
    "prefill",
    "step",
    "window_step",
]
