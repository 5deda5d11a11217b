"""mtpspec: speculative decoding with exact recurrent-state commit for hybrid GDN + attention LMs.

Table of contents:
  mtpspec.ops          the gated delta rule in every form, causal conv1d, norms (pure math)
  mtpspec.config       ModelConfig (Qwen3-Next / Qwen3.5), from_hf_config, presets
  mtpspec.models       parameters, layers, decoder + MTP head, decode state, prefill/step/window
  mtpspec.checkpoints  load_hf (HF safetensors, both families, mtp.*), orbax save/restore
"""

from mtpspec import checkpoints, config, models, ops
from mtpspec.config import ModelConfig

__all__ = ["ModelConfig", "checkpoints", "config", "models", "ops"]
__version__ = "0.1.0"
