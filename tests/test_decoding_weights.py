"""One copy of the weights for decoding (``DecodingWeights``, ``checkpoints.load(...,
for_decoding=True)``): the same tokens and log-probabilities as the canonical tree in every
implementation, the tied embedding stored once (gathered from the packed head), the canonical
leaves freed as they are converted, no whole-table temporary in the compiled program, a prefill
that runs the LM head on the last row only, and clear errors for what such weights cannot do."""

from __future__ import annotations

import dataclasses

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import mtpspec
from mtpspec import checkpoints, decoding, models
from mtpspec import config as C
from mtpspec.decoding.draft_vocab import DraftVocab
from mtpspec.kernels import cpu_linear
from mtpspec.models import inference
from mtpspec.models.inference import DecodingWeights, Embedding, Linear, decoding_weights

built = pytest.mark.skipif(not cpu_linear.available(), reason=cpu_linear.status()[1])
PROMPTS = [[1, 2, 3, 4, 5], [7, 8, 9]]


def _bf16(config, params):
    cfg = dataclasses.replace(config, dtype="bfloat16")
    return cfg, jax.tree.map(lambda x: x.astype(jnp.bfloat16), params)


@pytest.fixture(scope="module")
def tied():  # Qwen3.5-like: tied embedding, bf16 storage
    config = C.tiny_hybrid(**{**C.TWO_LAYERS, "mlp_types": ("dense", "dense")}, vocab_size=8192)
    return _bf16(config, models.init_params(config, jax.random.key(5), norm_scale=0.1))


@pytest.fixture(scope="module")
def untied():  # Qwen3-Next-like: untied head, MoE, float32
    config = C.tiny_moe(vocab_size=96, **C.TWO_LAYERS)
    return config, models.init_params(config, jax.random.key(6), norm_scale=0.1)


def _run(config, params, **options):
    return mtpspec.generate(
        config, params, PROMPTS, max_new_tokens=12, return_logprobs=True, **options
    )


RUNS = {
    ("tied", "ffi"): ("vocab", "sampled"),
    ("tied", "xla"): ("k2",),
    ("untied", "ffi"): ("k2", "sampled"),
    ("untied", "xla"): ("vocab",),
}


@pytest.mark.parametrize("linear", ["ffi", "xla"])
@pytest.mark.parametrize("which", ["tied", "untied"])
def test_decoding_weights_decode_exactly_as_the_canonical_tree(which, linear, request):
    """Plain greedy, MTP speculation (with and without a draft vocabulary) and sampling: tokens
    and log-probabilities bit for bit those of generate on the canonical tree."""
    if linear == "ffi" and not cpu_linear.available():
        pytest.skip(cpu_linear.status()[1])
    config, params = request.getfixturevalue(which)
    weights = decoding_weights(config, params, linear=linear)
    assert isinstance(weights, DecodingWeights) and weights.linear == linear
    vocab = DraftVocab(np.arange(0, config.vocab_size, 3), vocab_size=config.vocab_size)
    runs = {
        "k2": {"speculative": mtpspec.SpecConfig(num_draft=2)},
        "vocab": {"speculative": mtpspec.SpecConfig(num_draft=3, draft_vocab=vocab)},
        "sampled": {"temperature": 0.8, "seed": 3, "speculative": mtpspec.SpecConfig(num_draft=2)},
    }
    # plain everywhere; each speculative form on two of the four (tree, linear) pairs
    chosen = RUNS[which, linear]
    for options in [{}] + [runs[name] for name in chosen]:
        want = _run(config, params, linear=linear, **options)
        got = _run(config, weights, linear="auto", **options)  # "auto": the weights' own
        assert got.tokens == want.tokens, options
        np.testing.assert_array_equal(np.array(got.logprobs), np.array(want.logprobs))


@built
def test_the_tied_embedding_is_the_packed_head_and_bf16_stays_bf16(tied):
    config, params = tied
    weights = decoding_weights(config, params, linear="ffi")
    emb, head = weights["embed"], weights["lm_head"]
    assert isinstance(emb, Embedding) and emb.packed and isinstance(head, Linear)
    assert emb.w is head.w  # one array
    assert head.w.dtype == jnp.uint16 and cpu_linear.stored_dtype(head.w) == jnp.bfloat16
    ids = jnp.asarray([[0, 5, 17], [8191, 16, 255]])
    np.testing.assert_array_equal(  # rows gathered from the head, widened exactly
        np.asarray(emb[ids]), np.asarray(params["embed"][ids].astype(jnp.float32))
    )
    assert emb[ids].dtype == jnp.float32 and emb.rows(ids).dtype == jnp.bfloat16
    canonical = sum(x.nbytes for x in jax.tree.leaves(params))
    # the vectors are widened to float32 (norms, gates: a few KB); the matrices are not, and the
    # packed ones carry only their zero columns up to a multiple of 64 or 128 (a few % at H 64)
    packed = {
        id(m.w): m
        for m in jax.tree.leaves(weights.tree, is_leaf=lambda x: isinstance(x, Linear))
        if isinstance(m, Linear) and m.impl == "ffi"
    }
    padding = sum(
        (m.w.shape[0] * m.w.shape[2] - m.d_out) * m.d_in * m.w.dtype.itemsize
        for m in packed.values()
    )
    assert 0 < padding < 0.15 * canonical
    assert weights.nbytes < 1.05 * canonical + padding


@built
def test_the_decode_program_holds_no_widened_copy_of_the_table(tied):
    """XLA:CPU widens a bf16 gather's whole operand to float32 and hoists it out of the loop; the
    table is held as uint16 bits so the program's temporaries stay far below one table."""
    config, params = tied
    weights = decoding_weights(config, params, linear="ffi")
    prepared = decoding.prepare(config, weights, PROMPTS, max_new_tokens=8)
    temp = prepared.compiled()[0].memory_analysis().temp_size_in_bytes
    table = config.vocab_size * config.hidden_size * 4  # the table widened to float32
    assert temp < table / 2, (temp, table)

    def loop(w, t):  # negative control: the same gather from a bf16 array
        def body(c):
            i, acc = c
            return i + 1, acc + w[(t + i) % w.shape[0]].astype(jnp.float32).sum()

        return jax.lax.while_loop(lambda c: c[0] < 4, body, (0, 0.0))[1]

    bf16_table = params["embed"]
    control = jax.jit(loop).lower(bf16_table, jnp.arange(3)).compile()
    assert control.memory_analysis().temp_size_in_bytes >= table


@built
def test_prefill_runs_the_lm_head_on_the_last_row_only(tied):
    """A long prompt's program has no [prompt, vocabulary] logits buffer (a third of a real-size
    prefill's arithmetic and 0.5 GB at 512 tokens)."""
    config, params = tied
    weights = decoding_weights(config, params, linear="ffi")
    long = [list(range(1, 257))]
    prepared = decoding.prepare(config, weights, long, max_new_tokens=1)
    temp = prepared.compiled()[0].memory_analysis().temp_size_in_bytes
    assert temp < 256 * config.vocab_size * 4, temp
    got = mtpspec.generate(config, weights, long, max_new_tokens=3, return_logprobs=True)
    logits = models.forward(*_bf16_as_f32(config, params), jnp.asarray(long))[0, -1]
    assert got.tokens[0][0] == int(jnp.argmax(logits))


def _bf16_as_f32(config, params):
    return dataclasses.replace(config, dtype="float32"), jax.tree.map(
        lambda x: x.astype(jnp.float32), params
    )


@pytest.mark.parametrize("linear", ["ffi", "xla"])
def test_load_for_decoding_converts_as_it_reads_and_frees_the_canonical_tree(
    tied, linear, tmp_path
):
    if linear == "ffi" and not cpu_linear.available():
        pytest.skip(cpu_linear.status()[1])
    config, params = tied
    checkpoints.save_hf(config, params, tmp_path / "m", layout="conditional_generation")
    got_config, weights = checkpoints.load(tmp_path / "m", for_decoding=True, linear=linear)
    assert got_config == config and got_config.dtype == "bfloat16"  # the checkpoint's own
    assert isinstance(weights, DecodingWeights) and weights.linear == linear
    want = _run(config, params, linear=linear)
    assert _run(got_config, weights).tokens == want.tokens
    # every leaf is the decoding tree's own (the canonical leaves were deleted as converted)
    leaves = jax.tree.leaves(weights.tree)
    assert not any(x.is_deleted() for x in leaves)
    assert sum(x.nbytes for x in {id(x): x for x in leaves}.values()) == weights.nbytes
    f32_config, f32 = checkpoints.load(tmp_path / "m", for_decoding=True, dtype="float32")
    assert f32_config.dtype == "float32" and isinstance(f32, DecodingWeights)


def test_consume_deletes_only_what_the_new_tree_does_not_share(untied):
    config, params = untied
    params = jax.tree.map(lambda x: x + 0, params)  # a copy this test owns
    weights = decoding_weights(config, params, linear="xla", consume=True)
    kept = {id(x) for x in jax.tree.leaves(weights.tree)}
    for x in jax.tree.leaves(params):
        assert x.is_deleted() != (id(x) in kept)
    assert _run(config, weights).tokens == _run(config, weights).tokens


def test_decoding_weights_refuse_what_they_cannot_do(untied, tmp_path):
    config, params = untied
    weights = decoding_weights(config, params, linear="xla")
    other = dataclasses.replace(config, vocab_size=config.vocab_size + 1)
    with pytest.raises(ValueError, match="made for another config"):
        mtpspec.generate(other, weights, PROMPTS, max_new_tokens=2)
    if cpu_linear.available():
        with pytest.raises(ValueError, match="made for linear='xla'"):
            mtpspec.generate(config, weights, PROMPTS, max_new_tokens=2, linear="ffi")
    from mtpspec import sharding

    mesh = sharding.make_mesh(data=1, model=1)
    with pytest.raises(ValueError, match="cannot be sharded"):
        mtpspec.generate(config, weights, PROMPTS, max_new_tokens=2, mesh=mesh)
    with pytest.raises(ValueError, match="cannot take a mesh"):
        checkpoints.load(tmp_path, for_decoding=True, mesh=mesh)
    with pytest.raises(ValueError, match="unknown linear implementation"):
        checkpoints.load(tmp_path, for_decoding=True, linear="blas")
    assert "DecodingWeights(2 layers" in repr(weights)
    assert inference.MEMO.get(config, weights, "xla") is weights.tree
