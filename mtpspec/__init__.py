"""mtpspec: speculative decoding with exact recurrent-state commit for hybrid GDN + attention LMs.

Table of contents:
  mtpspec.ops          the gated delta rule in every form, causal conv1d, norms (pure math)
  mtpspec.config       ModelConfig (Qwen3-Next / Qwen3.5), from_hf_config, presets
  mtpspec.models       parameters, layers, decoder + MTP head, decode state, prefill/step/window
  mtpspec.checkpoints  load_hf (HF safetensors, both families, mtp.*), orbax save/restore
  mtpspec.decoding     generate / generate_stream, SpecConfig, commit strategies, proposers
  mtpspec.sharding     (data, model) mesh rules for params and decode state, memory estimates

  mtpspec.generate, mtpspec.SpecConfig   the main entry points (see DESIGN.md)
"""

from mtpspec import checkpoints, config, decoding, models, ops, sharding
from mtpspec.config import ModelConfig
from mtpspec.decoding import GenerateResult, SpecConfig, generate, generate_stream

__all__ = [
    "GenerateResult",
    "ModelConfig",
    "SpecConfig",
    "checkpoints",
    "config",
    "decoding",
    "generate",
    "generate_stream",
    "models",
    "ops",
    "sharding",
]
__version__ = "0.1.0"
