"""HF export (``checkpoints.save_hf``): exact round trip through ``load_hf`` for both families and
dtypes, single-file and sharded; exports of the HF fixtures reproduce the fixture files (tensor
names, shapes, dtypes, values; every config key); every bad argument raises before anything is
written; negative controls show that a wrong interleave would be caught. No torch here (the
transformers side is ``tests/hf``, run by ``make test-hf``). Params are drawn with numpy (no
compilation), so the whole file runs in seconds."""

from __future__ import annotations

import dataclasses
import json
import os
import subprocess
import sys

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from safetensors import safe_open

from mtpspec.checkpoints import from_hf_config, hf_config_dict, load_hf, save_hf
from mtpspec.checkpoints.hf_export import hf_tensors
from mtpspec.config import FULL, LINEAR, tiny_hybrid, tiny_moe
from mtpspec.models.params import param_shapes
from mtpspec.tokenizers import ByteTokenizer, byte_tokenizer_json

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
FIX = os.path.join(ROOT, "tests", "fixtures", "hf")


def _is_shape(x):
    return isinstance(x, tuple) and all(isinstance(d, int) for d in x)


def _random_params(config, seed=0):
    """Every leaf N(0, 1) (norms too: a (1 + w) norm stored as 1 + w would be caught)."""
    rng = np.random.default_rng(seed)
    shapes = param_shapes(config)
    return jax.tree.map(
        lambda s: jnp.asarray(rng.standard_normal(s, dtype=np.float32)).astype(config.dtype),
        shapes,
        is_leaf=_is_shape,
    )


def _bits_equal(a, b) -> bool:
    a, b = np.asarray(a), np.asarray(b)
    return a.dtype == b.dtype and a.shape == b.shape and a.tobytes() == b.tobytes()


def _tree_bits_equal(a, b) -> bool:
    if jax.tree.structure(a) != jax.tree.structure(b):
        return False
    return all(jax.tree.leaves(jax.tree.map(_bits_equal, a, b)))


def _files(d) -> dict[str, np.ndarray]:
    """Every tensor of a checkpoint directory (numpy, native dtype)."""
    out = {}
    for fn in sorted(os.listdir(d)):
        if fn.endswith(".safetensors"):
            with safe_open(os.path.join(d, fn), "flax") as f:
                for k in f.keys():
                    out[k] = np.asarray(f.get_tensor(k))
    return out


# ---------------------------------------------------------------------------------------------
# round trip


CONFIGS = {
    "qwen3_next": tiny_moe(),  # MoE + shared expert + a dense layer, untied, MoE MTP
    "qwen3_5": tiny_hybrid(),  # dense, tied
}


@pytest.mark.parametrize("family", ["qwen3_next", "qwen3_5"])
@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
@pytest.mark.parametrize("sharded", [False, True])
def test_save_load_round_trip_is_bit_exact(tmp_path, family, dtype, sharded):
    config = dataclasses.replace(CONFIGS[family], dtype=dtype)
    params = _random_params(config)
    total = sum(x.nbytes for x in jax.tree.leaves(params))
    limit = total // 5 if sharded else total
    files = save_hf(config, params, tmp_path / "out", max_shard_bytes=limit)
    got_config, got = load_hf(tmp_path / "out")
    assert got_config == config
    assert _tree_bits_equal(got, params)

    index = tmp_path / "out" / "model.safetensors.index.json"
    assert index.is_file() == sharded
    assert (tmp_path / "out" / "model.safetensors").is_file() == (not sharded)
    if sharded:
        weight_map = json.loads(index.read_text())["weight_map"]
        shards = sorted(set(weight_map.values()))
        assert len(shards) >= 5 and shards == [f for f in files if f.startswith("model-")]
        for shard in shards:
            with safe_open(str(tmp_path / "out" / shard), "flax") as f:
                sizes = [np.asarray(f.get_tensor(k)).nbytes for k in f.keys()]
            assert sum(sizes) <= limit or len(sizes) == 1
    cfg = json.loads((tmp_path / "out" / "config.json").read_text())
    depth_key = {"qwen3_5": "mtp_num_hidden_layers", "qwen3_next": "num_nextn_predict_layers"}
    assert cfg[depth_key[family]] == 1 and cfg["dtype"] == dtype
    assert any(k.startswith("mtp.") for k in _files(tmp_path / "out"))


def test_dtype_argument_casts_and_records(tmp_path):
    """f32 params stored as bf16 read back as the bf16 cast; bf16 stored as f32 exactly."""
    config = tiny_hybrid()
    params = _random_params(config)
    save_hf(config, params, tmp_path / "b", dtype="bfloat16")
    got_config, got = load_hf(tmp_path / "b")
    assert got_config == dataclasses.replace(config, dtype="bfloat16")
    assert _tree_bits_equal(got, jax.tree.map(lambda x: x.astype(jnp.bfloat16), params))
    save_hf(got_config, got, tmp_path / "f", dtype="float32")
    back_config, back = load_hf(tmp_path / "f")
    assert back_config == config
    assert _tree_bits_equal(back, jax.tree.map(lambda x: x.astype(jnp.float32), got))


def test_dense_model_exports_as_either_family(tmp_path):
    """The same dense tree written as Qwen3-Next (interleaved qkvz/ba, mlp_only_layers = all)
    reads back equal, with the family changed."""
    config = dataclasses.replace(tiny_hybrid(), linear_num_value_heads=6)  # r = 3
    params = _random_params(config)
    save_hf(config, params, tmp_path / "n", family="qwen3_next")
    got_config, got = load_hf(tmp_path / "n")
    assert got_config == dataclasses.replace(config, family="qwen3_next")
    assert _tree_bits_equal(got, params)
    names = set(_files(tmp_path / "n"))
    assert "model.layers.0.linear_attn.in_proj_qkvz.weight" in names
    assert not any("in_proj_qkv.weight" in n for n in names)


def test_no_mtp_writes_depth_zero_and_no_mtp_tensors(tmp_path):
    config = tiny_moe(mtp_num_layers=0)
    params = _random_params(config)
    save_hf(config, params, tmp_path / "o")
    assert json.loads((tmp_path / "o" / "config.json").read_text())["num_nextn_predict_layers"] == (
        0
    )
    assert not any(n.startswith("mtp.") for n in _files(tmp_path / "o"))
    got_config, got = load_hf(tmp_path / "o")
    assert got_config == config and _tree_bits_equal(got, params)


def test_overwrite_replaces_an_earlier_sharded_export(tmp_path):
    config = tiny_hybrid()
    params = _random_params(config)
    save_hf(config, params, tmp_path / "o", max_shard_bytes=50_000)
    other = _random_params(config, seed=1)
    with pytest.raises(FileExistsError, match="overwrite"):
        save_hf(config, other, tmp_path / "o")
    save_hf(config, other, tmp_path / "o", overwrite=True)
    assert sorted(os.listdir(tmp_path / "o")) == ["config.json", "model.safetensors"]
    assert _tree_bits_equal(load_hf(tmp_path / "o")[1], other)


@pytest.mark.parametrize("family", ["qwen3_next", "qwen3_5"])
@pytest.mark.parametrize("fused_experts", [False, True])
def test_every_spec_inverse_undoes_its_import(family, fused_experts):
    """inv(fn(hf tensors)) == the HF tensors for every entry of load_hf's table, including the
    fused-expert layout (import only) that export never writes."""
    from mtpspec.checkpoints.hf import model_specs

    config = tiny_moe(family=family) if family == "qwen3_next" else tiny_hybrid()
    prefixes = [f"model.layers.{i}.mlp." for i in range(config.num_layers)] + ["mtp.layers.0.mlp."]
    names = {p + "experts.gate_up_proj" for p in prefixes} if fused_experts else set()
    rng = np.random.default_rng(0)
    specs = model_specs(config, "model.", names)
    assert any("experts.gate_up_proj" in n for s in specs for n in s.names) == (
        fused_experts and family == "qwen3_next"
    )
    for spec in specs:
        hf = [rng.standard_normal(shape).astype(np.float32) for shape in spec.shapes]
        back = spec.inv(*spec.fn(*hf))
        assert len(back) == len(hf), spec.names
        for name, a, b in zip(spec.names, hf, back, strict=True):
            assert _bits_equal(np.ascontiguousarray(b), a), name


# ---------------------------------------------------------------------------------------------
# the HF fixtures are reproduced


# Keys the exporter cannot know and the loader never reads.
NOT_READ = {"transformers_version"}
# Legacy (transformers 4.5x) keys and how they read in the v5 style the exporter writes.
LEGACY = {
    "rope_theta": lambda c: c["rope_parameters"]["rope_theta"],
    "partial_rotary_factor": lambda c: c["rope_parameters"]["partial_rotary_factor"],
    "full_attention_interval": lambda c: (
        c["layer_types"].index(FULL) + 1
        if all(
            (t == FULL) == ((i + 1) % (c["layer_types"].index(FULL) + 1) == 0)
            for i, t in enumerate(c["layer_types"])
        )
        else None
    ),
    "rope_scaling": lambda c: None,  # null in the legacy file: no scaling, as rope_type default
}


@pytest.mark.parametrize(
    "name", ["qwen3_next", "qwen3_next_bf16_sharded", "qwen3_5", "qwen3_5_vl_layout", "qwen3_5_moe"]
)
def test_export_reproduces_fixture(tmp_path, name):
    src = os.path.join(FIX, name)
    config, params = load_hf(src)  # native dtype: bf16 for the sharded fixture
    sharded = "sharded" in name
    limit = 400_000 if sharded else 10**9  # the sharded fixture is 0.6 MB in two files
    save_hf(config, params, tmp_path / "o", max_position_embeddings=512, max_shard_bytes=limit)

    theirs = _files(src)
    if name == "qwen3_5_vl_layout":  # text weights only, in the text-model layout
        theirs = {
            k.replace("model.language_model.", "model."): v
            for k, v in theirs.items()
            if not k.startswith("model.visual.")
        }
    ours = _files(tmp_path / "o")
    assert sorted(ours) == sorted(theirs)
    for k in theirs:
        assert _bits_equal(ours[k], theirs[k]), k
    assert (tmp_path / "o" / "model.safetensors.index.json").is_file() == sharded

    fixture_cfg = json.loads(open(os.path.join(src, "config.json")).read())
    fixture_cfg = fixture_cfg.get("text_config", fixture_cfg)
    cfg = json.loads((tmp_path / "o" / "config.json").read_text())
    for key, value in fixture_cfg.items():
        if key in NOT_READ:
            continue
        got = LEGACY[key](cfg) if key not in cfg and key in LEGACY else cfg[key]
        assert got == value, (key, got, value)
    added = set(cfg) - set(fixture_cfg)
    if sharded:  # the legacy file's v5 equivalents
        added -= {"rope_parameters", "layer_types"}
    # Qwen3-Next's MTP depth key (vLLM's); the fixture relies on the loader's default of 1.
    assert added == ({"num_nextn_predict_layers"} if "next" in name else set())
    assert cfg.get("num_nextn_predict_layers", 1) == 1
    assert from_hf_config(cfg) == from_hf_config(src)


def test_negative_control_wrong_interleave_is_caught(tmp_path):
    """Writing Qwen3-Next's qkvz / ba un-interleaved (Qwen3.5 order, same shapes) or with b and a
    swapped differs from the fixture, and load_hf then returns different params."""
    config, params = load_hf(os.path.join(FIX, "qwen3_next"))
    theirs = _files(os.path.join(FIX, "qwen3_next"))
    tensors = hf_tensors(config, params)
    p = "model.layers.0.linear_attn."
    g = params["layers"][0]["gdn"]
    qkvz, ba = p + "in_proj_qkvz.weight", p + "in_proj_ba.weight"
    assert _bits_equal(tensors[qkvz], theirs[qkvz]) and _bits_equal(tensors[ba], theirs[ba])
    flat_qkvz = np.concatenate([np.asarray(g["w_qkv"]).T, np.asarray(g["w_z"]).T])
    flat_ba = np.concatenate([np.asarray(g["w_a"]).T, np.asarray(g["w_b"]).T])
    assert flat_qkvz.shape == theirs[qkvz].shape and flat_ba.shape == theirs[ba].shape
    assert not np.array_equal(flat_qkvz, theirs[qkvz])
    assert not np.array_equal(flat_ba, theirs[ba])

    save_hf(config, params, tmp_path / "o")
    from safetensors.numpy import save_file

    wrong = {**_files(tmp_path / "o"), qkvz: flat_qkvz}
    save_file(wrong, str(tmp_path / "o" / "model.safetensors"))
    _, got = load_hf(tmp_path / "o")
    assert not _tree_bits_equal(got, params)
    assert _tree_bits_equal(got["layers"][1], params["layers"][1])  # only layer 0 was broken


# ---------------------------------------------------------------------------------------------
# bad arguments: clear errors, nothing written


def _moe_no_shared():
    return tiny_moe(shared_expert_intermediate_size=0)


BAD = [
    ("family", lambda: tiny_hybrid(), {"family": "llama"}, ValueError, "family must be one of"),
    ("dtype", lambda: tiny_hybrid(), {"dtype": "float16"}, ValueError, "dtype must be one of"),
    ("mixed_moe_as_qwen3_5", lambda: tiny_moe(), {"family": "qwen3_5"}, ValueError, "mixed model"),
    (
        "qwen3_5_moe_without_shared",
        lambda: tiny_moe(mlp_types=("moe",) * 4, shared_expert_intermediate_size=0),
        {"family": "qwen3_5"},
        ValueError,
        "always have a shared expert",
    ),
    (
        "qwen3_5_moe_unnormalised",
        lambda: tiny_moe(mlp_types=("moe",) * 4, norm_topk_prob=False),
        {"family": "qwen3_5"},
        ValueError,
        "always normalises",
    ),
    (
        "dense_qwen3_5_with_moe_mtp",
        lambda: tiny_hybrid(
            num_experts=4,
            num_experts_per_tok=2,
            moe_intermediate_size=8,
            shared_expert_intermediate_size=8,
            mtp_mlp_type="moe",
        ),
        {"family": "qwen3_5"},
        ValueError,
        "MTP layer's MLP is MoE",
    ),
    ("moe_without_shared", _moe_no_shared, {}, ValueError, "shared expert"),
    (
        "mtp_mlp_not_layer0s",
        lambda: tiny_moe(mtp_mlp_type="dense"),
        {},
        ValueError,
        "mtp_mlp_type must equal mlp_types",
    ),
    (
        "unreadable_moe_fields",
        lambda: tiny_hybrid(num_experts=4, num_experts_per_tok=2),
        {},
        ValueError,
        "num_experts: 4 would read back as 0",
    ),
    (
        "unreadable_norm_topk",
        lambda: tiny_hybrid(norm_topk_prob=False),
        {},
        ValueError,
        "norm_topk_prob",
    ),
    ("shard_size", lambda: tiny_hybrid(), {"max_shard_bytes": 0}, ValueError, "max_shard_bytes"),
    ("shard_type", lambda: tiny_hybrid(), {"max_shard_bytes": 1.5}, TypeError, "max_shard_bytes"),
    (
        "max_positions",
        lambda: tiny_hybrid(),
        {"max_position_embeddings": 0},
        ValueError,
        "max_position_embeddings",
    ),
    ("tokenizer_type", lambda: tiny_hybrid(), {"tokenizer": 3}, TypeError, "tokenizer must be"),
    (
        "tokenizer_too_big",
        lambda: tiny_hybrid(),  # vocab 128 < 256 bytes
        {"tokenizer": ByteTokenizer()},
        ValueError,
        "256 ids but the model's vocab_size is 128",
    ),
]


@pytest.mark.parametrize("case", BAD, ids=[c[0] for c in BAD])
def test_bad_arguments_raise_before_writing(tmp_path, case):
    _, make, kwargs, exc, pattern = case
    config = make()
    with pytest.raises(exc, match=pattern):
        save_hf(config, _random_params(config), tmp_path / "o", **kwargs)
    assert not (tmp_path / "o").exists()


def test_bad_params_and_destination_raise_before_writing(tmp_path):
    config = tiny_hybrid()
    params = _random_params(config)
    with pytest.raises(TypeError, match="ModelConfig"):
        save_hf(dataclasses.asdict(config), params, tmp_path / "o")
    missing = {k: v for k, v in params.items() if k != "final_norm"}
    with pytest.raises(ValueError, match="final_norm"):
        save_hf(config, missing, tmp_path / "o")
    bad = jax.tree.map(lambda x: x, params)
    bad["layers"][2]["gdn"]["w_z"] = bad["layers"][2]["gdn"]["w_z"][:, :-1]
    with pytest.raises(ValueError, match=r"w_z.*shape"):
        save_hf(config, bad, tmp_path / "o")
    with pytest.raises(OSError, match="no tokenizer.json"):
        save_hf(config, params, tmp_path / "o", tokenizer=tmp_path / "nowhere")
    assert not (tmp_path / "o").exists()
    (tmp_path / "o").mkdir()
    (tmp_path / "o" / "notes.txt").write_text("mine")
    with pytest.raises(FileExistsError, match="not empty"):
        save_hf(config, params, tmp_path / "o")
    assert os.listdir(tmp_path / "o") == ["notes.txt"]
    (tmp_path / "f").write_text("")
    with pytest.raises(OSError, match="not a directory"):
        save_hf(config, params, tmp_path / "f")


def test_layer_pattern_the_family_expresses_with_mlp_only_layers():
    """A Qwen3-Next config with dense layers anywhere is written via mlp_only_layers."""
    config = tiny_moe(
        layer_types=(LINEAR, FULL, LINEAR, LINEAR, FULL),
        mlp_types=("moe", "dense", "dense", "moe", "dense"),
    )
    cfg = hf_config_dict(config)
    assert cfg["mlp_only_layers"] == [1, 2, 4] and cfg["decoder_sparse_step"] == 1
    assert from_hf_config(cfg) == config


# ---------------------------------------------------------------------------------------------
# tokenizer


def test_byte_tokenizer_json_is_the_byte_vocabulary(tmp_path):
    """ids 0..255 each exactly once, one ByteLevel character per byte (GPT-2's map: printable
    bytes are themselves, space is U+0120 'Ġ', newline U+010A 'Ċ'), no special tokens."""
    tok = byte_tokenizer_json()
    vocab = tok["model"]["vocab"]
    assert sorted(vocab.values()) == list(range(256))
    assert all(len(ch) == 1 for ch in vocab)
    assert vocab["A"] == ord("A") and vocab["~"] == ord("~") and vocab["ÿ"] == 0xFF
    assert vocab["\u0120"] == ord(" ") and vocab["\u010a"] == ord("\n")
    assert vocab["\u0100"] == 0 and vocab["\u0143"] == 0xAD  # the 68 non-printable, in order
    assert tok["added_tokens"] == [] and tok["model"]["merges"] == []
    assert tok["pre_tokenizer"]["use_regex"] is False
    assert tok["pre_tokenizer"]["add_prefix_space"] is False

    config = dataclasses.replace(tiny_hybrid(), vocab_size=256)
    files = save_hf(config, _random_params(config), tmp_path / "o", tokenizer=ByteTokenizer())
    assert {"tokenizer.json", "tokenizer_config.json"} <= set(files)
    assert json.loads((tmp_path / "o" / "tokenizer.json").read_text()) == tok
    tok_cfg = json.loads((tmp_path / "o" / "tokenizer_config.json").read_text())
    assert tok_cfg["clean_up_tokenization_spaces"] is False
    # a path is copied verbatim, with the tokenizer_config.json beside it
    save_hf(config, _random_params(config), tmp_path / "c", tokenizer=tmp_path / "o")
    for f in ("tokenizer.json", "tokenizer_config.json"):
        assert (tmp_path / "c" / f).read_bytes() == (tmp_path / "o" / f).read_bytes()


# ---------------------------------------------------------------------------------------------
# the command


def test_export_command_publishes_the_default_model(tmp_path):
    """experiments.export_hf on the shipped model: writes the HF directory and verifies it; an
    unknown family fails before writing."""
    env = {**os.environ, "JAX_PLATFORMS": "cpu"}
    out = tmp_path / "next"
    run = subprocess.run(
        [sys.executable, "-m", "experiments.export_hf", f"--out={out}", "--family=qwen3_next"],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert run.returncode == 0, run.stderr[-2000:]
    assert "config equal True, params bit-equal True" in run.stdout
    assert sorted(os.listdir(out)) == [
        "config.json",
        "model.safetensors",
        "tokenizer.json",
        "tokenizer_config.json",
    ]
    assert json.loads((out / "config.json").read_text())["architectures"] == [
        "Qwen3NextForCausalLM"
    ]
    bad = subprocess.run(
        [sys.executable, "-m", "experiments.export_hf", f"--out={tmp_path / 'bad'}", "--family=x"],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert bad.returncode != 0 and "family must be one of" in bad.stderr
    assert not (tmp_path / "bad").exists()


def test_conditional_generation_layout_is_the_released_qwen3_5_layout(tmp_path):
    """layout='conditional_generation' writes what the released Qwen3.5 repos hold (the text
    weights of the VL-layout fixture, name for name and bit for bit; the nested text_config), and
    reads back equal; Qwen3-Next has no such layout."""
    src = os.path.join(FIX, "qwen3_5_vl_layout")
    config, params = load_hf(src)
    save_hf(
        config, params, tmp_path / "vl", max_position_embeddings=512, max_shard_bytes=40_000,
        layout="conditional_generation",
    )  # fmt: skip
    theirs = {k: v for k, v in _files(src).items() if not k.startswith("model.visual.")}
    ours = _files(tmp_path / "vl")
    assert sorted(ours) == sorted(theirs)
    assert all(_bits_equal(ours[k], theirs[k]) for k in theirs)
    assert (tmp_path / "vl" / "model.safetensors.index.json").is_file()
    cfg = json.loads((tmp_path / "vl" / "config.json").read_text())
    fixture_cfg = json.loads(open(os.path.join(src, "config.json")).read())
    for key in ("architectures", "model_type", "tie_word_embeddings"):
        assert cfg[key] == fixture_cfg[key], key
    assert cfg["text_config"]["model_type"] == fixture_cfg["text_config"]["model_type"]
    got_config, got = load_hf(tmp_path / "vl")
    assert got_config == config and _tree_bits_equal(got, params)
    with pytest.raises(ValueError, match="Qwen3.5's"):
        save_hf(
            tiny_moe(), _random_params(tiny_moe()), tmp_path / "n", layout="conditional_generation"
        )
    with pytest.raises(ValueError, match="unknown layout"):
        save_hf(config, params, tmp_path / "x", layout="vl")
    assert not (tmp_path / "n").exists() and not (tmp_path / "x").exists()
