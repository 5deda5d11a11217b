"""Pure-math building blocks. Shape letters: b batch, t time, h heads, k key dim, v value dim,
c channels, w conv width.

  gated_delta_rule            the GDN recurrence, method = recurrent | chunk | assoc | auto | pallas
  gated_delta_rule_with_aux   plus the commit data (u_t, cumulative gates, states)
  gated_delta_rule_tree       the recurrence over a static tree (each node from its parent)
  resolve_gdn_method          what method="auto" picks for a shape and platform
  gdn_method_for              a method name checked (and resolved under a device mesh) for t
  state_after                 closed-form state after n tokens of a window, from the aux data
  commit_state                the same, or the C++ kernel's (native=True), as decoding commits
  causal_conv1d / causal_conv1d_step / conv_window_after   depthwise causal conv with SiLU
  causal_conv1d_tree          the same conv along each row's path of a tree
  l2_norm / rms_norm / gated_rms_norm
  argmax                      jnp.argmax over the last axis, vectorised on long (vocabulary) axes
"""

from mtpspec.ops.conv import (
    causal_conv1d,
    causal_conv1d_step,
    causal_conv1d_tree,
    conv_window_after,
)
from mtpspec.ops.gdn.api import (
    GDN_METHODS,
    commit_state,
    gated_delta_rule,
    gated_delta_rule_with_aux,
    gdn_method_for,
    resolve_gdn_method,
)
from mtpspec.ops.gdn.common import GDNAux, expand_key_heads, state_after
from mtpspec.ops.gdn.tree import gated_delta_rule_tree
from mtpspec.ops.norms import gated_rms_norm, l2_norm, rms_norm
from mtpspec.ops.reduce import argmax

__all__ = [
    "GDN_METHODS",
    "GDNAux",
    "argmax",
    "causal_conv1d",
    "commit_state",
    "causal_conv1d_step",
    "causal_conv1d_tree",
    "conv_window_after",
    "expand_key_heads",
    "gated_delta_rule",
    "gated_delta_rule_tree",
    "gated_delta_rule_with_aux",
    "gated_rms_norm",
    "gdn_method_for",
    "l2_norm",
    "resolve_gdn_method",
    "rms_norm",
    "state_after",
]
