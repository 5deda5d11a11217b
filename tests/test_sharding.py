"""Sharding rules (``mtpspec.sharding``) in this process, and the 8-device sharded-equals-unsharded
suite (``tests/multidevice``) in a subprocess with 8 simulated CPU devices."""

from __future__ import annotations

import os
import pathlib
import subprocess
import sys

import jax
import numpy as np
import pytest
from jax.sharding import PartitionSpec as P

from mtpspec import SpecConfig, generate, sharding
from mtpspec.config import FULL, TWO_LAYERS, qwen3_5_27b, qwen3_next_80b_a3b, tiny_moe
from mtpspec.models import init_params, param_shapes

ROOT = pathlib.Path(__file__).parent.parent
MODEL = sharding.MODEL


def _flat_specs(config, mesh):
    return sharding.param_specs(config, mesh)


@pytest.mark.parametrize("m", [1, 2, 3, 4, 6, 8, 12, 16])
@pytest.mark.parametrize("config_fn", [qwen3_next_80b_a3b, qwen3_5_27b, tiny_moe])
def test_state_is_split_exactly_like_the_weights_that_write_it(config_fn, m):
    config = config_fn()
    mesh = {"data": 2, "model": m}
    specs = sharding.param_specs(config, mesh)
    state = sharding.state_specs(config, 4, mesh)
    for i, t in enumerate(config.layer_types):
        layer = specs["layers"][i]
        if t == FULL:
            kv = state.layers[i].k
            assert kv == state.layers[i].v
            assert kv[1] == layer["attn"]["w_k"][1] == layer["attn"]["w_v"][1]
            assert layer["attn"]["w_q"][1] == layer["attn"]["w_o"][0]
            assert kv[0] == "data"
        else:
            g = layer["gdn"]
            st = state.layers[i]
            assert st.state[1] == g["w_z"][1] == g["w_b"][1] == g["A_log"][0] == g["w_out"][0]
            assert st.conv[2] == g["w_qkv"][1] == g["conv"][0]
    if config.mtp_num_layers:
        assert state.mtp.k[1] == specs["mtp"]["layer"]["attn"]["w_k"][1]


def test_rules_split_heads_experts_hidden_and_vocab_when_they_divide():
    config = qwen3_next_80b_a3b()  # 16 q heads, 2 KV heads, 16/32 GDN heads, 512 experts
    specs = sharding.param_specs(config, {"data": 1, "model": 8})
    attn = specs["layers"][3]["attn"]
    assert attn["w_q"] == P(None, MODEL) and attn["w_o"] == P(MODEL, None)
    assert attn["w_k"] == P(None, None)  # 2 KV heads do not split 8 ways: replicated
    gdn = specs["layers"][0]["gdn"]
    assert gdn["w_qkv"] == P(None, MODEL) and gdn["w_out"] == P(MODEL, None)
    moe = specs["layers"][0]["mlp"]
    assert moe["w_gate"] == P(MODEL, None, None) and moe["router"] == P(None, None)
    assert moe["shared"]["w_down"] == P(MODEL, None)
    assert specs["embed"] == P(MODEL, None) and specs["lm_head"] == P(None, MODEL)
    assert specs["final_norm"] == P(None)
    on4 = sharding.param_specs(config, {"data": 2, "model": 2})
    assert on4["layers"][3]["attn"]["w_k"] == P(None, MODEL)  # 2 KV heads split 2 ways
    rows = sharding.describe(config, {"data": 1, "model": 8})
    replicated = {r["path"] for r in rows if r["replicated_on_model"]}
    assert "['layers'][3]['attn']['w_k']" in replicated
    assert "['layers'][3]['attn']['w_q']" not in replicated


def test_memory_estimate_counts_every_parameter_once_per_shard():
    config = qwen3_next_80b_a3b()
    one = sharding.memory_estimate(config, {"data": 1, "model": 1}, batch=1, capacity=4096)
    total = sum(int(np.prod(s)) for s in jax.tree.leaves(param_shapes(config), is_leaf=_shape))
    assert one["total_params"] == total
    assert 79e9 < total < 83e9  # the published 80B
    assert one["param_bytes_per_device"] == total * 2  # bf16
    eight = sharding.memory_estimate(config, {"data": 1, "model": 8}, batch=1, capacity=4096)
    assert total * 2 / 8 < eight["param_bytes_per_device"] < total * 2 / 8 * 1.05
    dense = sharding.memory_estimate(qwen3_5_27b(), {"data": 1, "model": 1}, batch=1, capacity=1)
    assert 26e9 < dense["total_params"] < 29e9
    # KV + GDN state: per device it halves when the batch splits over data = 2
    a = sharding.memory_estimate(config, {"data": 1, "model": 4}, batch=8, capacity=4096)
    b = sharding.memory_estimate(config, {"data": 2, "model": 4}, batch=8, capacity=4096)
    assert b["state_bytes_per_device"] * 2 == a["state_bytes_per_device"]
    t = sharding.memory_estimate(config, {"data": 1, "model": 8}, batch=1, capacity=1, train=True)
    assert t["optimizer_bytes_per_device"] == 2 * t["grad_bytes_per_device"]
    assert t["grad_bytes_per_device"] == t["param_bytes_per_device"]  # bf16, as adamw keeps them
    assert t["total_bytes_per_device"] == 4 * t["param_bytes_per_device"]  # no decode state


def _shape(x):
    return isinstance(x, tuple) and all(isinstance(d, int) for d in x)


def test_bad_meshes_raise_clear_errors():
    config = tiny_moe(**TWO_LAYERS)
    params = init_params(config, jax.random.key(0))
    with pytest.raises(TypeError, match="jax.sharding.Mesh"):
        generate(config, params, [[1, 2]], max_new_tokens=4, mesh="2x4")
    bad = jax.sharding.Mesh(np.array(jax.devices()[:1]).reshape(1), ("x",))
    with pytest.raises(ValueError, match="mesh axes must be exactly"):
        generate(config, params, [[1, 2]], max_new_tokens=4, mesh=bad)
    mesh = sharding.make_mesh(1, 1)
    other = init_params(tiny_moe(), jax.random.key(0))
    with pytest.raises(ValueError, match="parameter tree"):
        generate(config, other, [[1, 2]], max_new_tokens=4, mesh=mesh)
    pallas = SpecConfig(proposer="mtp", num_draft=2, verify_method="pallas")
    with pytest.raises(ValueError, match="not partitioned"):
        generate(config, params, [[1, 2]], max_new_tokens=4, mesh=mesh, speculative=pallas)
    with pytest.raises(ValueError, match="together"):
        sharding.initialize_distributed(process_id=0)  # raises before any jax.distributed call
    with pytest.raises(ValueError, match="process_id must be in"):
        sharding.initialize_distributed("127.0.0.1:1", 2, 2)
    with pytest.raises(ValueError, match="needs 16 devices"):
        sharding.make_mesh(2, 8)
    with pytest.raises(ValueError, match="positive int"):
        sharding.make_mesh(0)
    with pytest.raises(ValueError, match="axis_types"):
        sharding.make_mesh(1, 1, axis_types="manual")
    for text in ("8", "2x", "x4", "2x4x1", "0x8", "a x b"):
        with pytest.raises(ValueError, match="DATAxMODEL"):
            sharding.parse_mesh(text)
    assert sharding.parse_mesh("2x4") == (2, 4)


def test_one_device_mesh_generation_equals_no_mesh():
    config = tiny_moe(**TWO_LAYERS)
    params = init_params(config, jax.random.key(1), norm_scale=0.1)
    prompts = [[3, 4, 5, 6], [9, 8]]
    ref = generate(config, params, prompts, max_new_tokens=16).tokens
    got = generate(config, params, prompts, max_new_tokens=16, mesh=sharding.make_mesh(1, 1))
    assert got.tokens == ref


@pytest.mark.slow(340)
def test_sharded_equals_unsharded_on_8_simulated_devices():
    """Runs tests/multidevice in a fresh process with 8 CPU devices (meshes 1x8 and 2x4)."""
    env = dict(os.environ)
    env["XLA_FLAGS"] = (
        env.get("XLA_FLAGS", "") + " --xla_force_host_platform_device_count=8"
    ).strip()
    env["MTPSPEC_MULTIDEVICE"] = "1"
    env["JAX_PLATFORMS"] = "cpu"
    proc = subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "tests/multidevice"],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=1500,
    )
    tail = (proc.stdout + proc.stderr)[-6000:]
    assert proc.returncode == 0, tail
    assert " passed" in proc.stdout and "skipped" not in proc.stdout, tail
