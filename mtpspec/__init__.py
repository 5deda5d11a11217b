"""mtpspec: speculative decoding with exact recurrent-state commit for hybrid GDN + attention LMs.

Table of contents:
  mtpspec.ops       the gated delta rule in every form, causal conv1d, norms (pure math)
"""

from mtpspec import ops

__all__ = ["ops"]
__version__ = "0.1.0"
