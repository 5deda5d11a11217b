"""transformers loads what ``save_hf`` writes (``make test-hf``; needs the ``hf`` extra, skipped
without torch): the shipped default model exported as either family, and a random Qwen3-Next MoE
model (MoE + shared expert + dense layer + MoE MTP, untied) stored in f32 and bf16, and a random
Qwen3.5-MoE model (MoE everywhere, EOS ids in generation_config.json). Logits agree
with mtpspec's to 1e-5 relative (observed ~1e-6), greedy decoding equals transformers'
``generate``, HF reports no missing or unexpected weights, and the exported byte tokenizer
encodes / decodes exactly as ``ByteTokenizer``."""

from __future__ import annotations

import dataclasses
import pathlib

import jax
import pytest

pytest.importorskip("torch")
pytest.importorskip("transformers")

from experiments.check_hf_export import compare  # noqa: E402
from mtpspec import checkpoints  # noqa: E402
from mtpspec.config import tiny_moe  # noqa: E402
from mtpspec.models.params import init_params  # noqa: E402
from mtpspec.tokenizers import ByteTokenizer  # noqa: E402

TOL = 1e-5
DEFAULT_MODEL = (
    pathlib.Path(checkpoints.__file__).resolve().parent.parent / "assets" / "default_model"
)


@pytest.mark.parametrize("family", ["qwen3_5", "qwen3_next"])
def test_default_model_export_matches_in_transformers(tmp_path, family):
    config, params = checkpoints.load(DEFAULT_MODEL)
    checkpoints.save_hf(config, params, tmp_path / "o", family=family, tokenizer=ByteTokenizer())
    r = compare(tmp_path / "o", config, params, length=96, greedy_tokens=24)
    assert (
        r["hf_class"]
        == {"qwen3_5": "Qwen3_5ForCausalLM", "qwen3_next": "Qwen3NextForCausalLM"}[family]
    )
    assert r["hf_loading_problems"] == {}
    assert r["logits_rel_err"] < TOL, r
    assert r["argmax_agreement"] == 1.0, r
    assert r["greedy_equal"], r
    t = r["tokenizer"]
    assert (
        t["vocab"] == 256 and t["encode_equal"] and t["decode_equal"] and t["hftokenizer_equal"]
    ), t


@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
def test_random_moe_export_matches_in_transformers(tmp_path, dtype):
    config = tiny_moe(vocab_size=256)
    params = init_params(config, jax.random.PRNGKey(3), norm_scale=0.1)
    checkpoints.save_hf(config, params, tmp_path / "o", dtype=dtype)
    stored = jax.tree.map(lambda x: x.astype(dtype), params)  # what the files hold
    r = compare(
        tmp_path / "o", dataclasses.replace(config, dtype=dtype), stored, length=48, greedy_tokens=8
    )
    assert r["hf_class"] == "Qwen3NextForCausalLM"
    assert r["hf_loading_problems"] == {}
    assert r["logits_rel_err"] < TOL, r
    assert r["greedy_equal"], r
    assert r["tokenizer"] is None


def test_negative_control_swapped_key_head_groups_is_detected(tmp_path):
    """A deliberately wrong interleave (layer 0's in_proj_qkvz with its key-head groups swapped,
    same shape) loads without complaint but gives logits far from mtpspec's: the comparison
    above can fail."""
    config = tiny_moe(vocab_size=256)
    params = init_params(config, jax.random.PRNGKey(3), norm_scale=0.1)
    checkpoints.save_hf(config, params, tmp_path / "o")
    from safetensors.numpy import load_file, save_file

    f = tmp_path / "o" / "model.safetensors"
    tensors = load_file(str(f))
    name = "model.layers.0.linear_attn.in_proj_qkvz.weight"
    w = tensors[name]
    hk = config.linear_num_key_heads
    tensors[name] = w.reshape(hk, -1, w.shape[-1])[::-1].reshape(w.shape).copy()  # groups swapped
    save_file(tensors, str(f), metadata={"format": "pt"})
    r = compare(tmp_path / "o", config, params, length=32, greedy_tokens=4)
    assert r["logits_rel_err"] > 1e-3, r


def test_random_qwen3_5_moe_export_matches_in_transformers(tmp_path):
    """Qwen3.5-MoE (MoE in every layer and the MTP layer, shared expert, untied) written as
    family qwen3_5: transformers reads it as Qwen3_5MoeForCausalLM, same logits and greedy."""
    config = dataclasses.replace(
        tiny_moe(vocab_size=256),
        family="qwen3_5",
        mlp_types=("moe",) * 4,
        mtp_mlp_type="moe",
        intermediate_size=0,  # no dense MLP anywhere (the read-back check refuses an unused one)
    )
    params = init_params(config, jax.random.PRNGKey(4), norm_scale=0.1)
    checkpoints.save_hf(config, params, tmp_path / "o", eos_token_id=[0, 1])
    r = compare(tmp_path / "o", config, params, length=48, greedy_tokens=8)
    assert r["hf_class"] == "Qwen3_5MoeForCausalLM"
    assert r["hf_loading_problems"] == {}
    assert r["logits_rel_err"] < TOL, r
    assert r["greedy_equal"], r
