"""mtpspec: speculative decoding with exact recurrent-state commit for hybrid GDN + attention LMs.

Table of contents:
  mtpspec.ops          the gated delta rule in every form, causal conv1d, norms (pure math)
  mtpspec.config       ModelConfig (Qwen3-Next / Qwen3.5), presets
  mtpspec.models       parameters, layers, decoder + MTP head, decode state, prefill/step/window
  mtpspec.checkpoints  load_hf / save_hf (HF safetensors, both families, mtp.*), the HF config
                       mapping both ways, orbax save/restore
  mtpspec.tokenizers   ByteTokenizer, HFTokenizer (one interface: encode / decode / chat
                       template / EOS ids); checkpoints.load_tokenizer picks one
  mtpspec.text         text in, text out: complete / TextStream (stop strings), chat_prompt
  mtpspec.decoding     generate / generate_stream / prepare, SpecConfig, the stages of a verify
                       step, commit strategies, proposers (one module each)
  mtpspec.training     offline corpus, optax training with an MTP loss, orbax resume
  mtpspec.sharding     (data, model) mesh rules for params and decode state, memory estimates
  mtpspec.analysis     timing, cost pieces, sweeps, the acceptance model, plots

  mtpspec.generate, mtpspec.SpecConfig   the main entry points (docs/design.md in the repository)
  mtpspec.DraftVocab   the ids the MTP proposer drafts among (SpecConfig.draft_vocab)
"""

from mtpspec import checkpoints, config, decoding, models, ops, sharding, text
from mtpspec.config import ModelConfig
from mtpspec.decoding import DraftVocab, GenerateResult, SpecConfig, generate, generate_stream

__all__ = [
    "DraftVocab",
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
    "text",
]
__version__ = "0.1.0"
