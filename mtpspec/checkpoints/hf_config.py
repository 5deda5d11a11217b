"""Both directions of the HF ``config.json`` <-> ``ModelConfig`` mapping, side by side.

  from_hf_config(cfg)          HF config (dict, config.json path or checkpoint directory) ->
                               ModelConfig; v5 and legacy key styles, and the released Qwen3.5
                               layout with a nested ``text_config``
  hf_config_dict(config, ...)  ModelConfig -> the ``config.json`` dict of a family, in
                               transformers 5.x style; checked by reading it back through
                               ``from_hf_config`` (any field the family cannot express raises)

The tensor mapping is the table in ``checkpoints/hf.py`` (``model_specs``), also both directions.
"""

from __future__ import annotations

import dataclasses
import json
import os
from collections.abc import Mapping
from typing import Any

from mtpspec.config import FAMILIES, FULL, LINEAR, ModelConfig, check_dtype

# HF's class default for both families; vLLM takes its default max_model_len from it.
DEFAULT_MAX_POSITION_EMBEDDINGS = 32768
_MTP_KEY = {"qwen3_5": "mtp_num_hidden_layers", "qwen3_next": "num_nextn_predict_layers"}
SUPPORTED_MODEL_TYPES = (
    "qwen3_next",
    "qwen3_5",
    "qwen3_5_text",
    "qwen3_5_moe",
    "qwen3_5_moe_text",
)


# ---- HF -> ModelConfig --------------------------------------------------------------------------


def _get(cfg: Mapping[str, Any], key: str, default=None, *, required: bool = False):
    if key in cfg and cfg[key] is not None:
        return cfg[key]
    if required:
        raise ValueError(f"HF config is missing required key {key!r}")
    return default


def _number(cfg: Mapping[str, Any], key: str, kind, default=None, *, required: bool = False):
    """``kind(cfg[key])`` (int or float), a ValueError naming the key when it is not a number."""
    value = _get(cfg, key, default, required=required)
    if isinstance(value, bool) or not isinstance(value, int | float) or value != value:
        raise ValueError(f"HF config key {key!r} must be a number, got {value!r}")
    try:
        out = kind(value)
    except OverflowError as e:  # int(inf)
        raise ValueError(f"HF config key {key!r} must be finite, got {value!r}") from e
    if kind is int and isinstance(value, float) and value != out:
        raise ValueError(f"HF config key {key!r} must be an integer, got {value!r}")
    return out


def _mapping(value, what: str) -> Mapping[str, Any]:
    if not isinstance(value, Mapping):
        raise ValueError(f"{what} must be a JSON object, got {type(value).__name__}: {value!r:.80}")
    return value


def _read(cfg) -> Mapping[str, Any]:
    """The config dict of a dict, a config.json path or a checkpoint directory."""
    if not isinstance(cfg, Mapping):
        path = os.fspath(cfg)
        if os.path.isdir(path):
            path = os.path.join(path, "config.json")
        try:
            with open(path) as f:
                cfg = json.load(f)
        except FileNotFoundError as e:
            raise OSError(f"no HF config at {path}") from e
        except json.JSONDecodeError as e:
            raise ValueError(f"HF config {path} is not valid JSON: {e}") from e
    return _mapping(cfg, "an HF config")


def from_hf_config(cfg: Mapping[str, Any] | str | os.PathLike) -> ModelConfig:
    """ModelConfig from an HF config dict, a config.json path, or a checkpoint directory."""
    cfg = _read(cfg)
    model_type = cfg.get("model_type")
    top = cfg
    if "text_config" in cfg:  # released Qwen3.5 layout (ConditionalGeneration)
        cfg = {**_mapping(cfg["text_config"], "the HF config's text_config")}
        model_type = cfg.get("model_type", model_type)
    if model_type in ("qwen3_next",):
        family = "qwen3_next"
    elif model_type in ("qwen3_5", "qwen3_5_text", "qwen3_5_moe_text", "qwen3_5_moe"):
        family = "qwen3_5"
    else:
        raise ValueError(
            f"unsupported model_type {model_type!r}: expected one of {SUPPORTED_MODEL_TYPES}"
        )
    # Qwen3.5-MoE: every layer (and the MTP layer) is a routed MoE with a shared expert and
    # normalised top-k weights; its config has no mlp_only_layers / decoder_sparse_step /
    # norm_topk_prob keys (Qwen3_5MoeTextConfig)
    all_moe = model_type in ("qwen3_5_moe", "qwen3_5_moe_text")

    n = _number(cfg, "num_hidden_layers", int, required=True)
    layer_types = _get(cfg, "layer_types")
    if layer_types is None:
        interval = _number(cfg, "full_attention_interval", int, 4)
        if interval < 1:
            raise ValueError(f"full_attention_interval must be >= 1, got {interval}")
        layer_types = [FULL if (i + 1) % interval == 0 else LINEAR for i in range(n)]
    if not isinstance(layer_types, list | tuple) or any(
        lt not in (FULL, LINEAR) for lt in layer_types
    ):
        raise ValueError(
            f"layer_types must be a list of {FULL!r} / {LINEAR!r}, got {layer_types!r}"
        )
    if len(layer_types) != n:
        raise ValueError(f"layer_types has {len(layer_types)} entries, num_hidden_layers is {n}")

    rope = _get(cfg, "rope_parameters") or _get(cfg, "rope_scaling") or {}
    rope = _mapping(rope, "the HF config's rope_parameters / rope_scaling")
    if rope.get("rope_type", "default") not in ("default",) and "mrope_section" not in rope:
        raise ValueError(f"unsupported rope_type {rope.get('rope_type')!r}")
    rope_theta = _number(rope, "rope_theta", float, _number(cfg, "rope_theta", float, 10000.0))
    partial = _number(
        rope, "partial_rotary_factor", float, _number(cfg, "partial_rotary_factor", float, 0.25)
    )

    num_experts = _number(cfg, "num_experts", int, 0)
    mlp_only = _get(cfg, "mlp_only_layers", []) or []
    if not isinstance(mlp_only, list | tuple) or not all(isinstance(i, int) for i in mlp_only):
        raise ValueError(f"mlp_only_layers must be a list of layer indices, got {mlp_only!r}")
    mlp_only = set(mlp_only)
    sparse_step = _number(cfg, "decoder_sparse_step", int, 1)
    if sparse_step < 1:
        raise ValueError(f"decoder_sparse_step must be >= 1, got {sparse_step}")

    if all_moe and (num_experts < 1 or not _number(cfg, "shared_expert_intermediate_size", int, 0)):
        raise ValueError(
            f"a {model_type} config needs num_experts >= 1 and shared_expert_intermediate_size "
            f"(got {num_experts}, {_get(cfg, 'shared_expert_intermediate_size')})"
        )

    def mlp_type(i: int) -> str:
        if all_moe:
            return "moe"
        if family == "qwen3_5" or num_experts == 0:
            return "dense"
        return "moe" if i not in mlp_only and (i + 1) % sparse_step == 0 else "dense"

    mtp_layers = _get(cfg, "mtp_num_hidden_layers", _get(cfg, "num_nextn_predict_layers", 1))
    tie = _get(cfg, "tie_word_embeddings", _get(top, "tie_word_embeddings", False))
    dtype = _get(cfg, "dtype", _get(cfg, "torch_dtype", "float32"))
    return ModelConfig(
        family=family,
        vocab_size=_number(cfg, "vocab_size", int, required=True),
        hidden_size=_number(cfg, "hidden_size", int, required=True),
        layer_types=tuple(layer_types),
        mlp_types=tuple(mlp_type(i) for i in range(n)),
        rms_norm_eps=_number(cfg, "rms_norm_eps", float, 1e-6),
        num_attention_heads=_number(cfg, "num_attention_heads", int, required=True),
        num_key_value_heads=_number(cfg, "num_key_value_heads", int, required=True),
        head_dim=_number(cfg, "head_dim", int, required=True),
        rope_theta=rope_theta,
        partial_rotary_factor=partial,
        linear_num_key_heads=_number(cfg, "linear_num_key_heads", int, required=True),
        linear_num_value_heads=_number(cfg, "linear_num_value_heads", int, required=True),
        linear_key_head_dim=_number(cfg, "linear_key_head_dim", int, required=True),
        linear_value_head_dim=_number(cfg, "linear_value_head_dim", int, required=True),
        linear_conv_kernel_dim=_number(cfg, "linear_conv_kernel_dim", int, 4),
        intermediate_size=_number(cfg, "intermediate_size", int, 0),
        num_experts=num_experts,
        num_experts_per_tok=_number(cfg, "num_experts_per_tok", int, 0),
        moe_intermediate_size=_number(cfg, "moe_intermediate_size", int, 0),
        shared_expert_intermediate_size=_number(cfg, "shared_expert_intermediate_size", int, 0),
        norm_topk_prob=True if all_moe else bool(_get(cfg, "norm_topk_prob", True)),
        mtp_mlp_type=mlp_type(0),
        tie_word_embeddings=bool(tie),
        mtp_num_layers=_number({"mtp_num_hidden_layers": mtp_layers}, "mtp_num_hidden_layers", int),
        dtype="bfloat16" if str(dtype) in ("bfloat16", "torch.bfloat16") else "float32",
    )


# ---- ModelConfig -> HF --------------------------------------------------------------------------


def _mrope_section(rotary_dim: int) -> list[int]:
    """Qwen3.5's 3-way split of the rotary frequencies (t, h, w), as the released configs split
    them ([11, 11, 10] of 32). For text all three position streams are equal, so the split does
    not change the result; it only has to cover rotary_dim / 2."""
    s = rotary_dim // 2
    return [(s + 2) // 3, (s + 1) // 3, s // 3]


def _family_errors(config: ModelConfig, family: str) -> list[str]:
    """What the family's HF code cannot express, in words (checked before the generic read-back,
    so the common cases get a specific message)."""
    errors = []
    moe_layers = [i for i, t in enumerate(config.mlp_types) if t == "moe"]
    if family == "qwen3_5" and moe_layers:  # Qwen3.5-MoE: MoE everywhere
        mtp_dense = config.mtp_num_layers and config.mtp_mlp_type != "moe"
        if len(moe_layers) != config.num_layers or mtp_dense:
            errors.append(
                "family 'qwen3_5' is either dense everywhere (Qwen3_5ForCausalLM) or MoE in every "
                f"layer and the MTP layer (Qwen3_5MoeForCausalLM), but the config has MoE layers "
                f"{moe_layers} of {config.num_layers} (MTP MLP {config.mtp_mlp_type!r}); export "
                "a mixed model as family='qwen3_next'"
            )
        if not config.shared_expert_intermediate_size:
            errors.append(
                "Qwen3.5-MoE blocks always have a shared expert, but "
                "shared_expert_intermediate_size is 0"
            )
        if not config.norm_topk_prob:
            errors.append("Qwen3.5-MoE always normalises its top-k weights (norm_topk_prob)")
    elif family == "qwen3_5":
        if config.mtp_num_layers and config.mtp_mlp_type == "moe":
            errors.append(
                "family 'qwen3_5' (Qwen3_5ForCausalLM) has dense MLPs only, but the MTP layer's "
                "MLP is MoE; export it as family='qwen3_next'"
            )
    else:
        uses_moe = moe_layers or (config.mtp_num_layers and config.mtp_mlp_type == "moe")
        if uses_moe and not config.shared_expert_intermediate_size:
            errors.append(
                "family 'qwen3_next' MoE blocks always have a shared expert "
                "(Qwen3NextSparseMoeBlock), but shared_expert_intermediate_size is 0"
            )
        first = config.mlp_types[0]
        if config.mtp_mlp_type != first:
            errors.append(
                f"family 'qwen3_next' builds the MTP layer's MLP like layer 0's (vLLM builds it "
                f"with layer index 0), so mtp_mlp_type must equal mlp_types[0] ({first!r}), "
                f"got {config.mtp_mlp_type!r}"
            )
    return errors


def _check_export_args(config, family, dtype, max_position_embeddings) -> tuple[str, str]:
    """(family, dtype) with their defaults, or ValueError / TypeError naming the problem."""
    if not isinstance(config, ModelConfig):
        raise TypeError(f"config must be a ModelConfig, got {type(config).__name__}")
    family = config.family if family is None else family
    if family not in FAMILIES:
        raise ValueError(f"family must be one of {FAMILIES}, got {family!r}")
    dtype = check_dtype(config.dtype if dtype is None else dtype)
    if (
        isinstance(max_position_embeddings, bool)
        or not isinstance(max_position_embeddings, int)
        or max_position_embeddings < 1
    ):
        raise ValueError(
            f"max_position_embeddings must be a positive int, got {max_position_embeddings!r}"
        )
    errors = _family_errors(config, family)
    if errors:
        raise ValueError("; ".join(errors))
    return family, dtype


def _moe_keys(c: ModelConfig) -> dict:
    """The MoE keys both families' configs share."""
    return {
        "num_experts": c.num_experts,
        "num_experts_per_tok": c.num_experts_per_tok,
        "moe_intermediate_size": c.moe_intermediate_size,
        "shared_expert_intermediate_size": c.shared_expert_intermediate_size,
        "output_router_logits": False,
        "router_aux_loss_coef": 0.001,
    }


def hf_config_dict(
    config: ModelConfig,
    *,
    family: str | None = None,
    dtype: str | None = None,
    max_position_embeddings: int = DEFAULT_MAX_POSITION_EMBEDDINGS,
) -> dict:
    """The ``config.json`` dict for ``config`` written as ``family`` with weights stored in
    ``dtype`` (default: the config's own). Pure: writes nothing.

    Raises ValueError (naming the problem) when the family cannot express the config, i.e.
    whenever ``from_hf_config`` of the result would differ from
    ``dataclasses.replace(config, family=family, dtype=dtype)``.
    """
    family, dtype = _check_export_args(config, family, dtype, max_position_embeddings)

    c = config
    out = {
        "attention_bias": False,
        "attention_dropout": 0.0,
        "bos_token_id": None,
        "dtype": dtype,
        "eos_token_id": None,
        "head_dim": c.head_dim,
        "hidden_act": "silu",
        "hidden_size": c.hidden_size,
        "initializer_range": 0.02,
        "intermediate_size": c.intermediate_size,
        "layer_types": list(c.layer_types),
        "linear_conv_kernel_dim": c.linear_conv_kernel_dim,
        "linear_key_head_dim": c.linear_key_head_dim,
        "linear_num_key_heads": c.linear_num_key_heads,
        "linear_num_value_heads": c.linear_num_value_heads,
        "linear_value_head_dim": c.linear_value_head_dim,
        "max_position_embeddings": max_position_embeddings,
        "num_attention_heads": c.num_attention_heads,
        "num_hidden_layers": c.num_layers,
        "num_key_value_heads": c.num_key_value_heads,
        "pad_token_id": None,
        "rms_norm_eps": c.rms_norm_eps,
        "tie_word_embeddings": c.tie_word_embeddings,
        "use_cache": True,
        "vocab_size": c.vocab_size,
        _MTP_KEY[family]: c.mtp_num_layers,
    }
    rope = {
        "partial_rotary_factor": c.partial_rotary_factor,
        "rope_theta": c.rope_theta,
        "rope_type": "default",
    }
    if family == "qwen3_5":
        out["architectures"] = ["Qwen3_5ForCausalLM"]
        out["model_type"] = "qwen3_5_text"
        out["mtp_use_dedicated_embeddings"] = False  # MTP shares embed_tokens / lm_head
        rope["mrope_interleaved"] = True
        rope["mrope_section"] = _mrope_section(c.rotary_dim)
        if "moe" in c.mlp_types:  # Qwen3.5-MoE (MoE in every layer; _family_errors checked)
            out["architectures"] = ["Qwen3_5MoeForCausalLM"]
            out["model_type"] = "qwen3_5_moe_text"
            del out["intermediate_size"]
            out.update(_moe_keys(c))
    else:
        out["architectures"] = ["Qwen3NextForCausalLM"]
        out["model_type"] = "qwen3_next"
        out["decoder_sparse_step"] = 1
        out["mlp_only_layers"] = [i for i, t in enumerate(c.mlp_types) if t == "dense"]
        out["norm_topk_prob"] = c.norm_topk_prob
        out.update(_moe_keys(c))
    out["rope_parameters"] = rope
    out = dict(sorted(out.items()))

    want = dataclasses.replace(config, family=family, dtype=dtype)
    got = from_hf_config(out)
    if got != want:
        diff = [
            f"{f.name}: {getattr(want, f.name)!r} would read back as {getattr(got, f.name)!r}"
            for f in dataclasses.fields(ModelConfig)
            if getattr(want, f.name) != getattr(got, f.name)
        ]
        raise ValueError(
            f"family {family!r} cannot express this config (from_hf_config reads the written "
            f"config.json back differently): {'; '.join(diff)}"
        )
    return out
