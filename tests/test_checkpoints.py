"""HF checkpoint loading (both families, sharded bf16, released VL layout), orbax round-trip,
and every loader error. The de-interleave checks rebuild the HF tensors from our params with
plain loops, independently of the loader's reshapes."""

from __future__ import annotations

import json
import os
import shutil

import jax
import numpy as np
import pytest
from safetensors import safe_open
from safetensors.numpy import save_file

from mtpspec.checkpoints import load_hf, restore_params, save_params
from mtpspec.models.params import param_shapes

FIX = os.path.join(os.path.dirname(__file__), "fixtures", "hf")
DIRS = (
    "qwen3_next",
    "qwen3_next_bf16_sharded",
    "qwen3_5",
    "qwen3_5_vl_layout",
    "qwen3_5_moe",
    "qwen3_5_moe_fused_vl",
)


def _raw(name: str) -> dict[str, np.ndarray]:
    """Every tensor of a fixture, as f32 numpy (bf16 upcast exactly)."""
    d = os.path.join(FIX, name)
    out = {}
    for fn in sorted(os.listdir(d)):
        if fn.endswith(".safetensors"):
            with safe_open(os.path.join(d, fn), "flax") as f:
                for k in f.keys():
                    out[k] = np.asarray(f.get_tensor(k)).astype(np.float32)
    return out


_CACHE: dict = {}


def _load(name: str, dtype="float32"):
    key = (name, dtype)
    if key not in _CACHE:
        _CACHE[key] = load_hf(os.path.join(FIX, name), dtype=dtype)
    return _CACHE[key]


def _np(x):
    return np.asarray(x).astype(np.float32)


def _is_shape(x):
    return isinstance(x, tuple) and all(isinstance(d, int) for d in x)


# ---------------------------------------------------------------------------------------------
# loading


@pytest.mark.parametrize("name", DIRS)
def test_fixture_loads_with_canonical_tree(name):
    config, params = _load(name)
    assert config.dtype == "float32"
    want = param_shapes(config)
    got = jax.tree.map(lambda x: tuple(x.shape), params)
    assert jax.tree.structure(got, is_leaf=_is_shape) == jax.tree.structure(want, is_leaf=_is_shape)
    assert got == want
    assert all(x.dtype == np.float32 for x in jax.tree.leaves(params))
    assert "mtp" in params
    assert ("lm_head" in params) == (not config.tie_word_embeddings)


def test_qwen3_next_deinterleave_matches_raw():
    config, params = _load("qwen3_next")
    raw = _raw("qwen3_next")
    hk, hv = config.linear_num_key_heads, config.linear_num_value_heads
    dk, dv, r = config.linear_key_head_dim, config.linear_value_head_dim, hv // hk
    for i, lt in enumerate(config.layer_types):
        if lt != "linear_attention":
            continue
        g_ = params["layers"][i]["gdn"]
        w_qkv, w_z = _np(g_["w_qkv"]).T, _np(g_["w_z"]).T  # [out, in] like HF
        q_all = w_qkv[: hk * dk]
        k_all = w_qkv[hk * dk : 2 * hk * dk]
        v_all = w_qkv[2 * hk * dk :]
        rows = []
        for g in range(hk):
            for j in range(dk):
                rows.append(q_all[g * dk + j])
            for j in range(dk):
                rows.append(k_all[g * dk + j])
            for h in range(g * r, g * r + r):
                for j in range(dv):
                    rows.append(v_all[h * dv + j])
            for h in range(g * r, g * r + r):
                for j in range(dv):
                    rows.append(w_z[h * dv + j])
        np.testing.assert_array_equal(
            np.stack(rows), raw[f"model.layers.{i}.linear_attn.in_proj_qkvz.weight"]
        )
        w_b, w_a = _np(g_["w_b"]).T, _np(g_["w_a"]).T
        rows = []
        for g in range(hk):
            rows += [w_b[h] for h in range(g * r, g * r + r)]
            rows += [w_a[h] for h in range(g * r, g * r + r)]
        np.testing.assert_array_equal(
            np.stack(rows), raw[f"model.layers.{i}.linear_attn.in_proj_ba.weight"]
        )
        np.testing.assert_array_equal(
            _np(g_["conv"]), raw[f"model.layers.{i}.linear_attn.conv1d.weight"][:, 0, :]
        )
        np.testing.assert_array_equal(
            _np(g_["w_out"]).T, raw[f"model.layers.{i}.linear_attn.out_proj.weight"]
        )


@pytest.mark.parametrize("name", ["qwen3_next", "qwen3_5"])
def test_attention_q_gate_split_matches_raw(name):
    config, params = _load(name)
    raw = _raw(name)
    hq, hd = config.num_attention_heads, config.head_dim
    layers = [(f"model.layers.{i}.", params["layers"][i]) for i in range(config.num_layers)]
    layers.append(("mtp.layers.0.", params["mtp"]["layer"]))
    n = 0
    for prefix, layer in layers:
        if "attn" not in layer:
            continue
        n += 1
        wq, wg = _np(layer["attn"]["w_q"]).T, _np(layer["attn"]["w_gate"]).T
        rows = []
        for h in range(hq):
            rows += [wq[h * hd + j] for j in range(hd)]
            rows += [wg[h * hd + j] for j in range(hd)]
        np.testing.assert_array_equal(np.stack(rows), raw[f"{prefix}self_attn.q_proj.weight"])
        for ours, theirs in (("w_k", "k_proj"), ("w_v", "v_proj"), ("w_o", "o_proj")):
            np.testing.assert_array_equal(
                _np(layer["attn"][ours]).T, raw[f"{prefix}self_attn.{theirs}.weight"]
            )
    assert n == 2


def test_qwen3_next_moe_mtp_and_heads_match_raw():
    config, params = _load("qwen3_next")
    raw = _raw("qwen3_next")
    np.testing.assert_array_equal(_np(params["embed"]), raw["model.embed_tokens.weight"])
    np.testing.assert_array_equal(_np(params["lm_head"]).T, raw["lm_head.weight"])
    np.testing.assert_array_equal(_np(params["final_norm"]), raw["model.norm.weight"])
    for prefix, mlp in (
        ("model.layers.0.mlp.", params["layers"][0]["mlp"]),
        ("mtp.layers.0.mlp.", params["mtp"]["layer"]["mlp"]),
    ):
        np.testing.assert_array_equal(_np(mlp["router"]).T, raw[f"{prefix}gate.weight"])
        for e in range(config.num_experts):
            for ours, theirs in (
                ("w_gate", "gate_proj"),
                ("w_up", "up_proj"),
                ("w_down", "down_proj"),
            ):
                np.testing.assert_array_equal(
                    _np(mlp[ours][e]).T, raw[f"{prefix}experts.{e}.{theirs}.weight"]
                )
        np.testing.assert_array_equal(
            _np(mlp["shared"]["w_down"]).T, raw[f"{prefix}shared_expert.down_proj.weight"]
        )
        np.testing.assert_array_equal(
            _np(mlp["shared_gate"]), raw[f"{prefix}shared_expert_gate.weight"].T
        )
    dense = params["layers"][1]["mlp"]  # mlp_only_layers = [1]
    assert set(dense) == {"w_gate", "w_up", "w_down"}
    np.testing.assert_array_equal(_np(dense["w_up"]).T, raw["model.layers.1.mlp.up_proj.weight"])
    mtp = params["mtp"]
    np.testing.assert_array_equal(_np(mtp["fc"]).T, raw["mtp.fc.weight"])
    np.testing.assert_array_equal(_np(mtp["norm_embed"]), raw["mtp.pre_fc_norm_embedding.weight"])
    np.testing.assert_array_equal(_np(mtp["norm_hidden"]), raw["mtp.pre_fc_norm_hidden.weight"])
    np.testing.assert_array_equal(_np(mtp["norm"]), raw["mtp.norm.weight"])


def test_qwen3_5_direct_projections_match_raw():
    config, params = _load("qwen3_5")
    raw = _raw("qwen3_5")
    g_ = params["layers"][0]["gdn"]
    p = "model.layers.0.linear_attn."
    for ours, theirs in (("w_qkv", "in_proj_qkv"), ("w_z", "in_proj_z"), ("w_b", "in_proj_b")):
        np.testing.assert_array_equal(_np(g_[ours]).T, raw[f"{p}{theirs}.weight"])
    np.testing.assert_array_equal(_np(g_["w_a"]).T, raw[f"{p}in_proj_a.weight"])
    np.testing.assert_array_equal(_np(g_["A_log"]), raw[f"{p}A_log"])
    np.testing.assert_array_equal(_np(g_["norm"]), raw[f"{p}norm.weight"])
    assert config.tie_word_embeddings and "lm_head" not in params


def test_bf16_sharded_upcasts_exactly():
    config, params = _load("qwen3_next_bf16_sharded")
    raw = _raw("qwen3_next_bf16_sharded")  # bf16 -> f32 upcast
    native_cfg, native = _load("qwen3_next_bf16_sharded", dtype=None)
    assert native_cfg.dtype == "bfloat16" and config.dtype == "float32"
    assert all(x.dtype == jax.numpy.bfloat16 for x in jax.tree.leaves(native))
    jax.tree.map(lambda a, b: np.testing.assert_array_equal(_np(a), np.asarray(b)), native, params)
    np.testing.assert_array_equal(_np(params["embed"]), raw["model.embed_tokens.weight"])
    q = _np(params["layers"][0]["gdn"]["w_qkv"])
    f32_cfg, f32 = _load("qwen3_next")
    # same architecture as the f32 fixture, weights equal to within bf16 rounding
    assert f32_cfg == config
    np.testing.assert_allclose(q, _np(f32["layers"][0]["gdn"]["w_qkv"]), rtol=1e-2, atol=1e-6)
    np.testing.assert_array_equal(
        _np(params["mtp"]["layer"]["mlp"]["w_down"][3]).T,
        raw["mtp.layers.0.mlp.experts.3.down_proj.weight"],
    )


def test_vl_layout_equals_text_layout():
    cfg_a, a = _load("qwen3_5")
    cfg_b, b = _load("qwen3_5_vl_layout")
    assert cfg_a == cfg_b
    assert jax.tree.structure(a) == jax.tree.structure(b)
    jax.tree.map(lambda x, y: np.testing.assert_array_equal(np.asarray(x), np.asarray(y)), a, b)


# ---------------------------------------------------------------------------------------------
# building modified checkpoints


def _write(tmp_path, base: str, tensors: dict[str, np.ndarray], config: dict | None = None):
    d = tmp_path / "ckpt"
    d.mkdir(exist_ok=True)
    if config is None:
        shutil.copy(os.path.join(FIX, base, "config.json"), d / "config.json")
    else:
        (d / "config.json").write_text(json.dumps(config))
    save_file(tensors, str(d / "model.safetensors"))
    return d


def _config(name: str) -> dict:
    with open(os.path.join(FIX, name, "config.json")) as f:
        return json.load(f)


def _assert_trees_equal(a, b):
    assert jax.tree.structure(a) == jax.tree.structure(b)
    jax.tree.map(lambda x, y: np.testing.assert_array_equal(np.asarray(x), np.asarray(y)), a, b)


def test_fused_expert_layout_accepted(tmp_path):
    raw = _raw("qwen3_next")
    config = _load("qwen3_next")[0]
    e = config.num_experts
    for prefix in ("model.layers.0.mlp.", "mtp.layers.0.mlp."):
        gate = [raw.pop(f"{prefix}experts.{j}.gate_proj.weight") for j in range(e)]
        up = [raw.pop(f"{prefix}experts.{j}.up_proj.weight") for j in range(e)]
        down = [raw.pop(f"{prefix}experts.{j}.down_proj.weight") for j in range(e)]
        raw[f"{prefix}experts.gate_up_proj"] = np.stack(
            [np.concatenate([g, u], axis=0) for g, u in zip(gate, up, strict=True)]
        )
        raw[f"{prefix}experts.down_proj"] = np.stack(down)
    _, params = load_hf(_write(tmp_path, "qwen3_next", raw), dtype="float32")
    _assert_trees_equal(params, _load("qwen3_next")[1])


def test_ignorable_tensors_and_tied_lm_head(tmp_path):
    raw = _raw("qwen3_5")
    raw["model.layers.3.self_attn.rotary_emb.inv_freq"] = np.ones(2, np.float32)
    raw["model.visual.patch_embed.proj.weight"] = np.ones((3, 3), np.float32)
    raw["lm_head.weight"] = raw["model.embed_tokens.weight"]
    _, params = load_hf(_write(tmp_path, "qwen3_5", raw))
    _assert_trees_equal(params, _load("qwen3_5")[1])


def test_orbax_round_trip(tmp_path):
    for name, dtype in (("qwen3_next", "float32"), ("qwen3_5", "float32")):
        config, params = _load(name, dtype)
        out = tmp_path / f"{name}_{dtype}"
        save_params(out, config, params)
        config2, params2 = restore_params(out)
        assert config2 == config
        _assert_trees_equal(params, params2)
        assert [x.dtype for x in jax.tree.leaves(params2)] == [
            x.dtype for x in jax.tree.leaves(params)
        ]
    config, params = _load("qwen3_next_bf16_sharded", None)
    save_params(tmp_path / "bf16", config, params)
    config2, params2 = restore_params(tmp_path / "bf16")
    assert config2 == config and config2.dtype == "bfloat16"
    assert all(x.dtype == jax.numpy.bfloat16 for x in jax.tree.leaves(params2))
    _assert_trees_equal(params, params2)
    with pytest.raises(FileExistsError, match="already exists"):
        save_params(tmp_path / "bf16", config, params)
    save_params(tmp_path / "bf16", config, params, overwrite=True)
    with pytest.raises(OSError, match="no saved config"):
        restore_params(tmp_path / "nowhere")


def test_save_rejects_wrong_tree(tmp_path):
    config, params = _load("qwen3_5")
    bad = {**params, "final_norm": params["final_norm"][:3]}
    with pytest.raises(ValueError, match="final_norm"):
        save_params(tmp_path / "x", config, bad)


# ---------------------------------------------------------------------------------------------
# errors


def test_missing_directory_config_weights(tmp_path):
    with pytest.raises(OSError, match="nope"):
        load_hf(tmp_path / "nope")
    d = tmp_path / "empty"
    d.mkdir()
    with pytest.raises(OSError, match="config.json"):
        load_hf(d)
    shutil.copy(os.path.join(FIX, "qwen3_5", "config.json"), d / "config.json")
    with pytest.raises(OSError, match="model.safetensors"):
        load_hf(d)


def test_missing_tensor(tmp_path):
    raw = _raw("qwen3_next")
    del raw["model.layers.2.linear_attn.in_proj_ba.weight"]
    with pytest.raises(
        ValueError, match=r"missing tensor model\.layers\.2\.linear_attn\.in_proj_ba"
    ):
        load_hf(_write(tmp_path, "qwen3_next", raw))


def test_missing_expert(tmp_path):
    raw = _raw("qwen3_next")
    del raw["mtp.layers.0.mlp.experts.2.up_proj.weight"]
    with pytest.raises(ValueError, match=r"mtp\.layers\.0\.mlp\.experts\.2\.up_proj\.weight"):
        load_hf(_write(tmp_path, "qwen3_next", raw))


def test_renamed_tensor_is_missing(tmp_path):
    raw = _raw("qwen3_5")
    raw["model.layers.0.linear_attn.in_proj_qkv_renamed.weight"] = raw.pop(
        "model.layers.0.linear_attn.in_proj_qkv.weight"
    )
    with pytest.raises(
        ValueError, match=r"missing tensor model\.layers\.0\.linear_attn\.in_proj_qkv\."
    ):
        load_hf(_write(tmp_path, "qwen3_5", raw))


def test_unexpected_tensor(tmp_path):
    raw = _raw("qwen3_5")
    raw["model.layers.1.mlp.bias"] = np.zeros(3, np.float32)
    with pytest.raises(ValueError, match=r"unexpected tensor model\.layers\.1\.mlp\.bias"):
        load_hf(_write(tmp_path, "qwen3_5", raw))


def test_missing_lm_head_when_untied(tmp_path):
    raw = _raw("qwen3_next")
    del raw["lm_head.weight"]
    with pytest.raises(ValueError, match=r"missing tensor lm_head\.weight"):
        load_hf(_write(tmp_path, "qwen3_next", raw))


def test_misshaped_tensor(tmp_path):
    raw = _raw("qwen3_next")
    raw["model.layers.3.self_attn.k_proj.weight"] = np.zeros((16, 64), np.float32)
    with pytest.raises(
        ValueError, match=r"k_proj\.weight has shape \[16, 64\], expected \[32, 64\]"
    ):
        load_hf(_write(tmp_path, "qwen3_next", raw))
    raw = _raw("qwen3_next")
    raw["model.layers.0.linear_attn.conv1d.weight"] = np.zeros((160, 4), np.float32)
    with pytest.raises(
        ValueError, match=r"conv1d\.weight has shape \[160, 4\], expected \[160, 1, 4\]"
    ):
        load_hf(_write(tmp_path, "qwen3_next", raw))


@pytest.mark.parametrize("keep", [0.5, 0.001])
def test_truncated_file(tmp_path, keep):
    d = tmp_path / "ckpt"
    shutil.copytree(os.path.join(FIX, "qwen3_5"), d)
    f = d / "model.safetensors"
    data = f.read_bytes()
    f.write_bytes(data[: max(1, int(len(data) * keep))])
    with pytest.raises((OSError, ValueError), match="model.safetensors"):
        load_hf(d)


def test_garbage_file(tmp_path):
    d = tmp_path / "ckpt"
    shutil.copytree(os.path.join(FIX, "qwen3_5"), d)
    (d / "model.safetensors").write_bytes(b"\x10\x00\x00\x00\x00\x00\x00\x00not json at all!" * 4)
    with pytest.raises((OSError, ValueError), match="model.safetensors"):
        load_hf(d)


def _copy_sharded(tmp_path):
    d = tmp_path / "sharded"
    shutil.copytree(os.path.join(FIX, "qwen3_next_bf16_sharded"), d)
    return d


def test_sharded_missing_shard(tmp_path):
    d = _copy_sharded(tmp_path)
    os.remove(d / "model-00002-of-00002.safetensors")
    with pytest.raises(OSError, match="model-00002-of-00002.safetensors"):
        load_hf(d)


def test_sharded_index_points_at_wrong_shard(tmp_path):
    d = _copy_sharded(tmp_path)
    idx = json.loads((d / "model.safetensors.index.json").read_text())
    wm = idx["weight_map"]
    name = "model.embed_tokens.weight"
    other = sorted(set(wm.values()) - {wm[name]})[0]
    wm[name] = other
    (d / "model.safetensors.index.json").write_text(json.dumps(idx))
    with pytest.raises(ValueError, match=r"model\.embed_tokens\.weight"):
        load_hf(d)


def test_sharded_truncated_shard_and_bad_index(tmp_path):
    d = _copy_sharded(tmp_path)
    shard = d / "model-00001-of-00002.safetensors"
    shard.write_bytes(shard.read_bytes()[:1000])
    with pytest.raises((OSError, ValueError), match="model-00001-of-00002.safetensors"):
        load_hf(d)
    (d / "model.safetensors.index.json").write_text("{not json")
    with pytest.raises(ValueError, match="model.safetensors.index.json"):
        load_hf(d)


@pytest.mark.parametrize(
    ("edit", "pattern"),
    [
        ({"num_key_value_heads": 3}, r"num_attention_heads \(4\) must be a multiple"),
        ({"linear_num_value_heads": 5}, "linear_num_value_heads"),
        ({"model_type": "llama"}, "unsupported model_type 'llama'"),
        ({"hidden_size": None}, "hidden_size"),
        ({"layer_types": ["linear_attention"] * 3}, "layer_types"),
    ],
)
def test_bad_config_values(tmp_path, edit, pattern):
    cfg = _config("qwen3_5")
    cfg.update(edit)
    d = tmp_path / "ckpt"
    d.mkdir()
    (d / "config.json").write_text(json.dumps(cfg))
    shutil.copy(os.path.join(FIX, "qwen3_5", "model.safetensors"), d / "model.safetensors")
    with pytest.raises(ValueError, match=pattern):
        load_hf(d)


def test_bad_config_json(tmp_path):
    d = tmp_path / "ckpt"
    shutil.copytree(os.path.join(FIX, "qwen3_5"), d)
    (d / "config.json").write_text("{")
    with pytest.raises(ValueError, match="config.json"):
        load_hf(d)


def test_bad_dtype_argument():
    with pytest.raises(ValueError, match="float16"):
        load_hf(os.path.join(FIX, "qwen3_5"), dtype="float16")


def test_missing_mtp(tmp_path):
    raw = {k: v for k, v in _raw("qwen3_5").items() if not k.startswith("mtp.")}
    d = _write(tmp_path, "qwen3_5", raw)
    with pytest.raises(ValueError, match=r"no mtp\.\* tensors.*allow_missing_mtp"):
        load_hf(d)
    config, params = load_hf(d, allow_missing_mtp=True)
    assert config.mtp_num_layers == 0 and "mtp" not in params
    full = _load("qwen3_5")[1]
    _assert_trees_equal(params, {k: v for k, v in full.items() if k != "mtp"})


def test_mtp_tensors_dropped_when_config_says_none(tmp_path):
    cfg = _config("qwen3_5")
    cfg["mtp_num_hidden_layers"] = 0
    config, params = load_hf(_write(tmp_path, "qwen3_5", _raw("qwen3_5"), cfg))
    assert config.mtp_num_layers == 0 and "mtp" not in params


def test_partial_mtp_is_missing_tensor(tmp_path):
    raw = _raw("qwen3_5")
    del raw["mtp.fc.weight"]
    with pytest.raises(ValueError, match=r"missing tensor mtp\.fc\.weight"):
        load_hf(_write(tmp_path, "qwen3_5", raw), allow_missing_mtp=True)


@pytest.mark.parametrize(
    "cfg",
    [
        {"model_type": "qwen3_moe"},
        {"model_type": "llama"},
        {"model_type": "qwen3_vl_moe", "text_config": {"model_type": "qwen3_vl_moe_text"}},
        {"model_type": "qwen3_5_moe", "text_config": {"model_type": "qwen3_omni_moe_text"}},
    ],
)
def test_unsupported_model_types_are_refused_by_name(cfg):
    from mtpspec.checkpoints import from_hf_config

    name = cfg.get("text_config", cfg)["model_type"]
    with pytest.raises(ValueError, match=f"unsupported model_type '{name}'"):
        from_hf_config(cfg)


def test_qwen3_5_moe_config_without_experts_is_refused():
    import json as _json

    from mtpspec.checkpoints import from_hf_config

    cfg = _json.loads(open(os.path.join(FIX, "qwen3_5_moe", "config.json")).read())
    cfg["num_experts"] = 0
    with pytest.raises(ValueError, match="needs num_experts >= 1"):
        from_hf_config(cfg)
