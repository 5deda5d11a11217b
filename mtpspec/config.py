"""Model configuration: one frozen dataclass for Qwen3-Next (MoE) and Qwen3.5 (dense) text models.

Built from a preset (``tiny_hybrid``, ``default_model``, the published shapes) or from an HF
``config.json`` (``checkpoints.from_hf_config``; both directions of that mapping live in
``checkpoints/hf_config.py``). Variants via ``dataclasses.replace``.
"""

from __future__ import annotations

import dataclasses
import numbers
from collections.abc import Sequence

import numpy as np

LINEAR = "linear_attention"
FULL = "full_attention"
FAMILIES = ("qwen3_next", "qwen3_5")
DTYPES = ("float32", "bfloat16")  # parameter storage dtypes


def check_dtype(dtype) -> str:
    """The name in ``DTYPES`` of ``dtype`` (a name, or a NumPy / JAX dtype or scalar type);
    ValueError naming anything else (``"int8"``, ``"float16"``, ``"fp32"``)."""
    if isinstance(dtype, str):
        name = dtype
    else:
        try:
            name = np.dtype(dtype).name
        except TypeError:
            name = None
    if name not in DTYPES:
        raise ValueError(f"dtype must be one of {DTYPES}, got {dtype!r}")
    return name


@dataclasses.dataclass(frozen=True)
class ModelConfig:
    family: str  # "qwen3_next" (interleaved in_proj_qkvz, MoE) | "qwen3_5" (split proj, dense)
    vocab_size: int
    hidden_size: int
    layer_types: tuple[str, ...]  # "linear_attention" (GDN) | "full_attention", per layer
    mlp_types: tuple[str, ...]  # "dense" | "moe", per layer
    rms_norm_eps: float = 1e-6
    # gated full attention
    num_attention_heads: int = 4
    num_key_value_heads: int = 2
    head_dim: int = 16
    rope_theta: float = 10000.0
    partial_rotary_factor: float = 0.25
    # gated delta net
    linear_num_key_heads: int = 2
    linear_num_value_heads: int = 4
    linear_key_head_dim: int = 16
    linear_value_head_dim: int = 16
    linear_conv_kernel_dim: int = 4
    # MLP / MoE
    intermediate_size: int = 128
    num_experts: int = 0
    num_experts_per_tok: int = 0
    moe_intermediate_size: int = 0
    shared_expert_intermediate_size: int = 0
    norm_topk_prob: bool = True
    mtp_mlp_type: str = "dense"
    # heads
    tie_word_embeddings: bool = False
    mtp_num_layers: int = 1
    dtype: str = "float32"  # parameter / compute dtype; GDN state and norms always f32

    def __post_init__(self):
        self.validate()

    @property
    def num_layers(self) -> int:
        return len(self.layer_types)

    @property
    def rotary_dim(self) -> int:
        return int(self.head_dim * self.partial_rotary_factor)

    @property
    def conv_channels(self) -> int:
        return 2 * self.linear_num_key_heads * self.linear_key_head_dim + (
            self.linear_num_value_heads * self.linear_value_head_dim
        )

    def validate(self) -> None:
        def need(cond, msg):
            if not cond:
                raise ValueError(f"invalid ModelConfig: {msg}")

        need(self.family in FAMILIES, f"family must be one of {FAMILIES}, got {self.family!r}")
        for name in (
            "vocab_size",
            "hidden_size",
            "num_attention_heads",
            "num_key_value_heads",
            "head_dim",
            "linear_num_key_heads",
            "linear_num_value_heads",
            "linear_key_head_dim",
            "linear_value_head_dim",
            "linear_conv_kernel_dim",
        ):
            value = getattr(self, name)
            need(
                isinstance(value, int) and value >= 1,
                f"{name} must be a positive int, got {value!r}",
            )
        need(len(self.layer_types) >= 1, "at least one layer is needed")
        bad = [t for t in self.layer_types if t not in (LINEAR, FULL)]
        need(not bad, f"layer_types must be {LINEAR!r} or {FULL!r}, got {bad}")
        need(
            len(self.mlp_types) == len(self.layer_types),
            f"mlp_types has {len(self.mlp_types)} entries for {len(self.layer_types)} layers",
        )
        bad = [t for t in (*self.mlp_types, self.mtp_mlp_type) if t not in ("dense", "moe")]
        need(not bad, f"mlp types must be 'dense' or 'moe', got {bad}")
        need(
            self.num_attention_heads % self.num_key_value_heads == 0,
            f"num_attention_heads ({self.num_attention_heads}) must be a multiple of "
            f"num_key_value_heads ({self.num_key_value_heads})",
        )
        need(
            self.linear_num_value_heads % self.linear_num_key_heads == 0,
            f"linear_num_value_heads ({self.linear_num_value_heads}) must be a multiple of "
            f"linear_num_key_heads ({self.linear_num_key_heads})",
        )
        need(
            0.0 < self.partial_rotary_factor <= 1.0 and self.rotary_dim % 2 == 0,
            f"partial_rotary_factor {self.partial_rotary_factor} must give an even rotary dim "
            f"in (0, head_dim]",
        )
        need(self.rope_theta > 0, f"rope_theta must be positive, got {self.rope_theta}")
        need(self.rms_norm_eps > 0, f"rms_norm_eps must be positive, got {self.rms_norm_eps}")
        if "moe" in (*self.mlp_types, self.mtp_mlp_type if self.mtp_num_layers else "dense"):
            need(self.num_experts >= 1, "MoE layers need num_experts >= 1")
            need(
                1 <= self.num_experts_per_tok <= self.num_experts,
                f"num_experts_per_tok ({self.num_experts_per_tok}) must be in "
                f"1..num_experts ({self.num_experts})",
            )
            need(self.moe_intermediate_size >= 1, "MoE layers need moe_intermediate_size >= 1")
        if "dense" in self.mlp_types:
            need(self.intermediate_size >= 1, "dense layers need intermediate_size >= 1")
        need(
            self.mtp_num_layers in (0, 1),
            f"mtp_num_layers must be 0 or 1, got {self.mtp_num_layers}",
        )
        need(self.dtype in DTYPES, f"dtype must be one of {DTYPES}, got {self.dtype!r}")


def tiny_hybrid(**overrides) -> ModelConfig:
    """A small random-init hybrid for tests: 3 GDN layers + 1 attention layer, dense MLP, MTP."""
    base = ModelConfig(
        family="qwen3_5",
        vocab_size=128,
        hidden_size=64,
        layer_types=(LINEAR, LINEAR, LINEAR, FULL),
        mlp_types=("dense",) * 4,
        num_attention_heads=4,
        num_key_value_heads=2,
        head_dim=16,
        partial_rotary_factor=0.5,
        linear_num_key_heads=2,
        linear_num_value_heads=4,
        linear_key_head_dim=16,
        linear_value_head_dim=8,
        intermediate_size=96,
        tie_word_embeddings=True,
    )
    return dataclasses.replace(base, **overrides)


# One GDN layer + one attention layer (MoE, then dense MLP): the smallest program that still has
# every layer kind; tests that compile many generate programs use it (`tiny_moe(**TWO_LAYERS)`).
TWO_LAYERS = {"layer_types": (LINEAR, FULL), "mlp_types": ("moe", "dense")}


def tiny_moe(**overrides) -> ModelConfig:
    """Tiny Qwen3-Next-style preset: MoE with a shared expert and one dense layer, untied head."""
    settings = dict(
        family="qwen3_next",
        mlp_types=("moe", "dense", "moe", "moe"),
        num_experts=4,
        num_experts_per_tok=2,
        moe_intermediate_size=32,
        shared_expert_intermediate_size=48,
        mtp_mlp_type="moe",
        tie_word_embeddings=False,
    )
    return tiny_hybrid(**{**settings, **overrides})


def token_id_list(config: ModelConfig, ids, name: str) -> list[int]:
    """``ids`` — None, one token id, or a sequence / 1-d array of ids — as a list of ints in the
    vocabulary, duplicates removed (None: []). ValueError naming ``name`` otherwise. The one check
    behind decoding's ``eos_id`` and the HF export's ``eos_token_id``."""
    if ids is None:
        return []
    seq = ids
    if hasattr(ids, "__array__") and not isinstance(ids, Sequence):  # numpy / jax arrays, scalars
        arr = np.asarray(ids)
        seq = arr.reshape(-1).tolist() if arr.ndim <= 1 else None
    elif not isinstance(ids, Sequence) or isinstance(ids, str | bytes):
        seq = [ids]
    if seq is None or not all(
        isinstance(i, numbers.Integral) and not isinstance(i, bool | np.bool_) for i in seq
    ):
        raise ValueError(
            f"{name} must be None, a token id or a sequence of token ids in "
            f"[0, {config.vocab_size}), got {ids!r}"
        )
    bad = [int(i) for i in seq if not 0 <= int(i) < config.vocab_size]
    if bad:
        raise ValueError(
            f"{name} holds {bad[0]}, outside the vocabulary [0, {config.vocab_size}) (got {ids!r})"
        )
    return list(dict.fromkeys(int(i) for i in seq))


def _family(**fields) -> ModelConfig:
    """The default model's family (byte vocabulary, Qwen3.5 layout, tied embeddings, one MTP
    layer) with ``fields`` set."""
    base = ModelConfig(
        family="qwen3_5",
        vocab_size=256,
        hidden_size=128,
        layer_types=(LINEAR, LINEAR, FULL, LINEAR, LINEAR, FULL),
        mlp_types=("dense",) * 6,
        num_attention_heads=4,
        num_key_value_heads=2,
        head_dim=32,
        partial_rotary_factor=0.5,
        linear_num_key_heads=2,
        linear_num_value_heads=4,
        linear_key_head_dim=32,
        linear_value_head_dim=32,
        intermediate_size=384,
        tie_word_embeddings=True,
    )
    return dataclasses.replace(base, **fields)


DEFAULT_SHAPE = (12, 256)  # layers, hidden size of the shipped default model


def default_model(**overrides) -> ModelConfig:
    """The shape of the shipped default model (``mtpspec/assets/default_model``):
    ``default_like(12, 256)``, 11.15M parameters — GDN with full attention every third layer, like
    Qwen, and one MTP layer. docs/decisions.md says why this shape (deep enough that one MTP
    layer and the LM head are a small share of a step)."""
    return default_like(*DEFAULT_SHAPE, **overrides)


def first_default_model(**overrides) -> ModelConfig:
    """The shape of the first shipped default model (2026-11-30 to 2026-12-02): 6 layers × 128,
    two KV heads, head dims 32 (1,567,328 parameters)."""
    return _family(**overrides)


def default_like(layers: int, hidden: int, **overrides) -> ModelConfig:
    """The default model's family at another size (``experiments.investigations.shape_sweep``
    measures what each costs): full attention every third layer, head dims 32 (H ≤ 128) else 64,
    attention heads H / head_dim with a quarter as KV heads (at least one), GDN key heads
    H / (2·dim) with twice as many value heads, dense MLP 3H, byte vocabulary, one MTP layer."""
    dim = 32 if hidden <= 128 else 64
    heads = max(hidden // dim, 1)
    groups = max(hidden // (2 * dim), 1)
    fields = dict(
        hidden_size=hidden,
        layer_types=tuple(FULL if (i + 1) % 3 == 0 else LINEAR for i in range(layers)),
        mlp_types=("dense",) * layers,
        num_attention_heads=heads,
        num_key_value_heads=max(heads // 4, 1),
        head_dim=dim,
        linear_num_key_heads=groups,
        linear_num_value_heads=2 * groups,
        linear_key_head_dim=dim,
        linear_value_head_dim=dim,
        intermediate_size=3 * hidden,
    )
    return _family(**{**fields, **overrides})


# ---- published shapes (for memory estimates and sharding rules; weights come from load_hf) ----


def qwen3_next_80b_a3b(**overrides) -> ModelConfig:
    """The shape of Qwen3-Next-80B-A3B (its published config.json): 48 layers, full attention
    every 4th, 512 experts (10 routed + 1 shared), one MTP layer, bf16."""
    base = ModelConfig(
        family="qwen3_next",
        vocab_size=151936,
        hidden_size=2048,
        layer_types=tuple(FULL if i % 4 == 3 else LINEAR for i in range(48)),
        mlp_types=("moe",) * 48,
        num_attention_heads=16,
        num_key_value_heads=2,
        head_dim=256,
        rope_theta=10_000_000.0,
        partial_rotary_factor=0.25,
        linear_num_key_heads=16,
        linear_num_value_heads=32,
        linear_key_head_dim=128,
        linear_value_head_dim=128,
        intermediate_size=5120,
        num_experts=512,
        num_experts_per_tok=10,
        moe_intermediate_size=512,
        shared_expert_intermediate_size=512,
        mtp_mlp_type="moe",
        tie_word_embeddings=False,
        dtype="bfloat16",
    )
    return dataclasses.replace(base, **overrides)


def _qwen3_5_dense(layers: int, **fields) -> ModelConfig:
    """A published dense Qwen3.5 text shape: full attention every 4th layer, 248,320-token
    vocabulary, heads of 256 (attention) and 16 × 128 (GDN keys), one MTP layer, bf16."""
    return ModelConfig(
        family="qwen3_5",
        vocab_size=248320,
        layer_types=tuple(FULL if i % 4 == 3 else LINEAR for i in range(layers)),
        mlp_types=("dense",) * layers,
        head_dim=256,
        rope_theta=10_000_000.0,
        partial_rotary_factor=0.25,
        linear_num_key_heads=16,
        linear_key_head_dim=128,
        linear_value_head_dim=128,
        dtype="bfloat16",
        **fields,
    )


def qwen3_5_27b(**overrides) -> ModelConfig:
    """The shape of the dense hybrid Qwen3.5-27B (its published text_config): 64 layers, full
    attention every 4th, 24 query / 4 KV heads, 16 / 48 GDN heads, one MTP layer, bf16."""
    base = _qwen3_5_dense(
        64,
        hidden_size=5120,
        num_attention_heads=24,
        num_key_value_heads=4,
        linear_num_value_heads=48,
        intermediate_size=17408,
        tie_word_embeddings=False,
    )
    return dataclasses.replace(base, **overrides)


def qwen3_5_0_8b(**overrides) -> ModelConfig:
    """The shape of Qwen3.5-0.8B's text model (its published text_config): 24 layers, full
    attention every 4th (18 GDN + 6 gated attention), H 1024, FFN 3584, 16 × 128 GDN key and value
    heads, 8 query / 2 KV heads of 256, a 248,320-token vocabulary with tied embeddings, one MTP
    layer, bf16."""
    base = _qwen3_5_dense(
        24,
        hidden_size=1024,
        num_attention_heads=8,
        num_key_value_heads=2,
        linear_num_value_heads=16,
        intermediate_size=3584,
        tie_word_embeddings=True,
    )
    return dataclasses.replace(base, **overrides)
