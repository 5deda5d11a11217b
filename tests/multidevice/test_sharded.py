"""Sharded = unsharded, on 8 simulated CPU devices (run by ``tests/test_sharding.py`` in its own
process with ``XLA_FLAGS=--xla_force_host_platform_device_count=8``; skipped otherwise).

The single-device references run in this same process (device 0 alone, no mesh). Speculative
greedy runs are compared with single-device *plain* greedy: they must emit exactly those tokens
(and the single-device speculative run equals it too, checked here for this config).
"""

from __future__ import annotations

import dataclasses
import importlib
import json
import shutil

import jax
import numpy as np
import pytest
from jax.sharding import NamedSharding
from jax.sharding import PartitionSpec as P

from mtpspec import SpecConfig, decoding, generate, sharding
from mtpspec.checkpoints import load_hf, restore_params, save_hf, save_params
from mtpspec.config import TWO_LAYERS, tiny_moe
from mtpspec.models import init_params

train_lib = importlib.import_module("mtpspec.training.train")  # the module, not the function

if jax.device_count() < 8:
    pytest.skip("needs 8 devices (run through tests/test_sharding.py)", allow_module_level=True)

MESHES = [(1, 8), (2, 4)]
# Every head / expert / hidden count divides 8, so 1x8 really splits every layer kind (a second
# config below keeps 2 KV heads and 4 experts, replicated on model, to cover that fallback).
CONFIG = tiny_moe(
    **TWO_LAYERS,
    num_attention_heads=16,
    num_key_value_heads=8,
    head_dim=8,
    linear_num_key_heads=8,
    linear_num_value_heads=16,
    linear_key_head_dim=8,
    linear_value_head_dim=8,
    num_experts=8,
    intermediate_size=64,
)
NEW = 24
SPECS = {
    "scan": SpecConfig(proposer="mtp", num_draft=2, commit="scan"),
    "states": SpecConfig(proposer="mtp", num_draft=2, commit="states"),
    "replay": SpecConfig(proposer="mtp", num_draft=2, commit="replay"),
}


@pytest.fixture(scope="module")
def model():
    params = init_params(CONFIG, jax.random.key(3), norm_scale=0.1)
    rng = np.random.default_rng(0)
    prompts = [rng.integers(0, CONFIG.vocab_size, n).tolist() for n in (7, 12, 3)]
    return params, prompts


@pytest.fixture(scope="module")
def reference(model):
    params, prompts = model
    return generate(CONFIG, params, prompts, max_new_tokens=NEW).tokens


@pytest.fixture(scope="module")
def spec_reference(model):
    params, prompts = model
    return generate(CONFIG, params, prompts, max_new_tokens=NEW, speculative=SPECS["scan"])


def test_single_device_speculative_equals_plain(spec_reference, reference):
    assert spec_reference.tokens == reference


# plain on 1x8, each commit on one mesh (both meshes split the model axis the state is sharded
# on; the full product compiles 8 sharded programs for the same property). Plain greedy on 2x4:
# test_explicit_mesh_is_accepted_and_gives_the_same_tokens.
RUNS = [((1, 8), None), ((1, 8), "scan"), ((2, 4), "states"), ((1, 8), "replay")]


@pytest.mark.parametrize("shape, spec", RUNS, ids=[f"{a}x{b}-{s or 'plain'}" for (a, b), s in RUNS])
def test_sharded_generation_emits_the_single_device_tokens(
    model, reference, spec_reference, shape, spec
):
    params, prompts = model
    mesh = sharding.make_mesh(*shape)
    got = generate(
        CONFIG,
        params,
        prompts,
        max_new_tokens=NEW,
        speculative=SPECS.get(spec),
        mesh=mesh,
    )
    assert got.tokens == reference
    assert len(got.stats["steps"]) == len(prompts)  # data-axis padding rows are dropped
    if spec is not None:  # greedy acceptance is a function of the tokens: same per-step counts
        for key in ("steps", "accepted", "tau", "position_acceptance"):
            assert got.stats[key] == spec_reference.stats[key], key
        assert got.stats["tau"] > 1.0


@pytest.mark.parametrize("shape", MESHES[1:], ids=["2x4"])  # data and model axes both split
def test_sharded_tree_speculation_emits_the_single_device_tokens(model, reference, shape):
    """A draft tree (MTP, 2x2) under a mesh: plain greedy's tokens and the single-device tree
    run's per-step acceptance."""
    params, prompts = model
    spec = SpecConfig(proposer="mtp", num_draft=2, tree=(2, 2))
    single = generate(CONFIG, params, prompts, max_new_tokens=NEW, speculative=spec)
    mesh = sharding.make_mesh(*shape)
    got = generate(CONFIG, params, prompts, max_new_tokens=NEW, speculative=spec, mesh=mesh)
    assert single.tokens == reference and got.tokens == reference
    assert got.stats["accepted"] == single.stats["accepted"]


def test_explicit_mesh_is_accepted_and_gives_the_same_tokens(model, reference):
    params, prompts = model
    auto = generate(CONFIG, params, prompts, max_new_tokens=NEW, mesh=sharding.make_mesh(2, 4))
    assert auto.tokens == reference  # plain greedy on 2x4 (an Auto mesh)
    assert len(auto.stats["steps"]) == len(prompts)  # data-axis padding rows are dropped
    compiled = decoding.compile_count()
    mesh = sharding.make_mesh(2, 4, axis_types="explicit")
    assert all(t == jax.sharding.AxisType.Explicit for t in mesh.axis_types)
    got = generate(CONFIG, params, prompts, max_new_tokens=NEW, mesh=mesh)
    assert got.tokens == reference
    other = [[9, 8, 7], [1, 2, 3, 4, 5], [6]]  # same buckets: no new compile either
    generate(CONFIG, params, other, max_new_tokens=NEW, mesh=mesh)
    assert decoding.compile_count() == compiled  # the explicit mesh reuses the auto program
    with jax.set_mesh(mesh):  # inside the user's explicit-mesh context as well
        got = generate(CONFIG, params, prompts, max_new_tokens=NEW, mesh=mesh)
    assert got.tokens == reference


def test_decode_state_is_sharded_with_its_heads(model, reference):
    """The carry after prefill: every state leaf has exactly the rule's sharding, and those
    shardings split KV caches / GDN state on the model axis (this config divides by 4)."""
    params, prompts = model
    mesh = sharding.make_mesh(2, 4)
    prepared = decoding.prepare(
        CONFIG, params, prompts, max_new_tokens=NEW, speculative=SPECS["scan"], mesh=mesh
    )
    for leaf, want in zip(
        jax.tree.leaves(prepared.args[0]),
        jax.tree.leaves(sharding.param_shardings(CONFIG, mesh)),
        strict=True,
    ):
        assert leaf.sharding == want
    carry = prepared.prefill()
    specs = sharding.state_specs(CONFIG, carry.pending.shape[0], mesh)
    for x, spec in zip(
        jax.tree.leaves(carry.state),
        jax.tree.leaves(specs, is_leaf=lambda s: isinstance(s, P)),
        strict=True,
    ):
        assert x.sharding.is_equivalent_to(NamedSharding(prepared.key.mesh, spec), x.ndim), (spec,)
    kv = carry.state.layers[1].k
    assert kv.addressable_shards[0].data.shape == (2, 8 // 4, kv.shape[2], 8)
    gdn = carry.state.layers[0].state
    assert gdn.addressable_shards[0].data.shape == (2, 16 // 4, 8, 8)
    # the streaming API runs the same sharded prefill and step from Python
    stream = decoding.generate_stream(
        CONFIG, params, prompts, max_new_tokens=NEW, speculative=SPECS["scan"], mesh=mesh
    )
    streamed = [[] for _ in prompts]
    for chunk in stream:
        for row, new in zip(streamed, chunk, strict=True):
            row.extend(new)
    assert streamed == reference


def test_kv_heads_that_do_not_divide_are_replicated_and_still_exact():
    config = tiny_moe(**TWO_LAYERS)  # 2 KV heads, 4 experts on a model axis of 8
    params = init_params(config, jax.random.key(4), norm_scale=0.1)
    prompts = [[5, 6, 7, 8, 9, 10], [3, 1]]
    ref = generate(config, params, prompts, max_new_tokens=16).tokens
    mesh = sharding.make_mesh(1, 8)
    got = generate(
        config, params, prompts, max_new_tokens=16, mesh=mesh, speculative=SPECS["states"]
    )
    assert got.tokens == ref
    specs = sharding.param_specs(config, mesh)
    assert specs["layers"][1]["attn"]["w_k"] == P(None, None)
    assert specs["layers"][0]["mlp"]["w_gate"] == P(None, None, None)


def test_sampled_speculative_generation_is_sharding_invariant(model):
    params, prompts = model
    kw = dict(max_new_tokens=NEW, temperature=0.9, top_k=20, seed=7, speculative=SPECS["scan"])
    ref = generate(CONFIG, params, prompts, **kw).tokens
    got = generate(CONFIG, params, prompts, mesh=sharding.make_mesh(2, 4), **kw).tokens
    assert got == ref


# The training runs: one device against a 2x4 mesh (data and model axes both split).
TC = train_lib.TrainConfig(steps=3, batch=4, seq_len=16, warmup=1, save_every=1, eval_every=3,
                           eval_batches=1, log_every=1)  # fmt: skip


def test_optimizer_state_is_placed_like_the_params_and_odd_batches_are_refused(model):
    """AdamW's moments on a mesh take their parameters' layout; a batch the data axis does not
    divide is refused before any compile. (The sharded training itself: the next test.)"""
    params, _ = model
    opt = train_lib.make_optimizer(TC)
    mesh = sharding.make_mesh(1, 8)
    opt_state = train_lib.init_opt_state(CONFIG, opt, params, mesh=mesh)
    mu = opt_state[1][0].mu  # AdamW's first moment: placed like the params
    assert mu["layers"][1]["attn"]["w_q"].sharding.spec == P(None, sharding.MODEL)
    assert mu["layers"][0]["gdn"]["w_out"].sharding.spec == P(sharding.MODEL, None)
    batch = np.zeros((3, 17), np.int32)
    sstep = train_lib.make_train_step(CONFIG, TC, opt, mesh=sharding.make_mesh(2, 4))
    with pytest.raises(ValueError, match="does not divide by the data axis"):
        sstep(params, opt_state, batch)  # refused before any compile


def test_sharded_train_checkpoints_and_resumes_in_its_layout(tmp_path, model):
    """train(mesh=2x4) logs the unsharded run's losses and ends on its weights (3 AdamW updates,
    in the sharded layout); with its last checkpoint deleted, the same command resumes from the
    one before, in the sharded layout, and repeats the last step's loss."""
    from mtpspec.training import data as data_lib

    params, _ = model
    rng = np.random.default_rng(5)
    corpus = data_lib.Corpus(
        rng.integers(0, 128, 4000).astype(np.uint8), rng.integers(0, 128, 800).astype(np.uint8), []
    )
    quiet = dict(log=lambda *_: None, init=params)
    mesh = sharding.make_mesh(2, 4)
    odd = dataclasses.replace(TC, batch=3)
    with pytest.raises(ValueError, match="does not divide by the data axis"):
        train_lib.train(CONFIG, odd, corpus, tmp_path / "odd", mesh=mesh, **quiet)
    assert not (tmp_path / "odd").exists()  # refused before any work
    ref_p, _ = train_lib.train(CONFIG, TC, corpus, tmp_path / "one", **quiet)
    got_p, _ = train_lib.train(CONFIG, TC, corpus, tmp_path / "mesh", mesh=mesh, **quiet)
    for a, b in zip(jax.tree.leaves(got_p), jax.tree.leaves(ref_p), strict=True):
        np.testing.assert_allclose(np.asarray(a), np.asarray(b), rtol=1e-4, atol=1e-6)
    assert got_p["layers"][0]["gdn"]["w_out"].sharding.spec == P(sharding.MODEL, None)

    def losses(run):
        rows = (tmp_path / run / "metrics.jsonl").read_text().splitlines()
        return [json.loads(r)["step"] for r in rows], [json.loads(r)["loss"] for r in rows]

    steps, ref = losses("one")
    assert losses("mesh")[0] == steps == [1, 2, 3]
    np.testing.assert_allclose(losses("mesh")[1], ref, rtol=1e-5)
    shutil.rmtree(tmp_path / "mesh" / "checkpoints" / "3")
    logs = []
    out, _ = train_lib.train(
        CONFIG, TC, corpus, tmp_path / "mesh", mesh=mesh, init=params, log=logs.append
    )
    assert any("resumed from step 2" in line for line in logs), logs
    assert out["layers"][1]["attn"]["w_q"].sharding.spec == P(None, sharding.MODEL)
    again = losses("mesh")
    assert again[0] == [1, 2, 3]
    np.testing.assert_allclose(again[1], ref, rtol=1e-5)


def test_load_hf_places_each_tensor_by_the_rules(tmp_path, model):
    params, _ = model
    save_hf(CONFIG, params, tmp_path / "ckpt", max_shard_bytes=200_000)
    mesh = sharding.make_mesh(2, 4)
    config, got = load_hf(tmp_path / "ckpt", mesh=mesh)
    assert config == CONFIG
    shardings = sharding.param_shardings(CONFIG, mesh)
    for a, b, sh in zip(
        jax.tree.leaves(got), jax.tree.leaves(params), jax.tree.leaves(shardings), strict=True
    ):
        assert a.sharding == sh
        np.testing.assert_array_equal(np.asarray(a), np.asarray(b))


def test_restore_params_reads_each_shard_into_its_layout(tmp_path, model):
    params, _ = model
    save_params(tmp_path / "p", CONFIG, params)
    mesh = sharding.make_mesh(1, 8)
    config, got = restore_params(tmp_path / "p", mesh=mesh)
    for a, b, sh in zip(
        jax.tree.leaves(got),
        jax.tree.leaves(params),
        jax.tree.leaves(sharding.param_shardings(config, mesh)),
        strict=True,
    ):
        assert a.sharding == sh
        np.testing.assert_array_equal(np.asarray(a), np.asarray(b))


@pytest.mark.parametrize("shape", MESHES, ids=["1x8", "2x4"])
def test_draft_and_ngram_proposers_under_a_mesh_emit_the_same_tokens(model, reference, shape):
    """The draft model's params and its own decode state are sharded by the same rules (its 2 KV
    heads replicated on model); n-gram drafts read the batch-sharded history."""
    params, prompts = model
    mesh = sharding.make_mesh(*shape)
    if shape == (2, 4):
        draft_config = tiny_moe(**TWO_LAYERS)
        draft = SpecConfig(
            proposer="draft",
            num_draft=2,
            commit="replay",
            draft_config=draft_config,
            draft_params=init_params(draft_config, jax.random.key(9), norm_scale=0.1),
        )
    else:
        draft = SpecConfig(proposer="ngram", num_draft=3, commit="states")
    got = generate(CONFIG, params, prompts, max_new_tokens=NEW, speculative=draft, mesh=mesh)
    assert got.tokens == reference
