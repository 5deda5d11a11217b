"""Speculative decoding oracles: commit(j) vs fresh replay for every j, speculative greedy vs plain
greedy token for token, and the loop's contracts (compiles, capacity, eos, streaming, errors)."""

from __future__ import annotations

import functools
import pathlib

import hypothesis.strategies as st
import jax
import jax.numpy as jnp
import numpy as np
import pytest
from hypothesis import given, settings

import mtpspec
from mtpspec import checkpoints, models
from mtpspec import config as C
from mtpspec.decoding import commit_window, ngram_propose, rewind_kv_only
from mtpspec.kernels import cpu_gdn
from mtpspec.models import GDNCache
from tests.conftest import users_jit
from tests.gdn_testing import rel_err

FIXTURES = pathlib.Path(__file__).parent / "fixtures" / "hf"
# A tiny vocabulary makes random models repeat themselves, so n-gram drafts hit and even a random
# MTP head is right now and then: every accepted length 0..k occurs.
SMALL_VOCAB = 8
PROMPTS = [[1, 2, 3, 4, 5, 6, 7, 1, 2, 3], [5, 3]]


@pytest.fixture(scope="module")
def moe_model():
    config = C.tiny_moe(vocab_size=SMALL_VOCAB, **C.TWO_LAYERS)
    return config, models.init_params(config, jax.random.key(3), norm_scale=0.1)


@pytest.fixture(scope="module")
def plain_moe(moe_model):
    config, params = moe_model
    return mtpspec.generate(config, params, PROMPTS, max_new_tokens=24)


# ---- commit --------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "strategy, native",
    [("scan", False), ("states", False), ("replay", False), ("replay", True)],
)
def test_commit_matches_fresh_replay_for_every_accepted_length(moe_model, strategy, native):
    """Every strategy, and "replay" through the C++ closed form (``native``: what decoding uses
    where the window's GDN ran the C++ kernel)."""
    if native and not cpu_gdn.available():
        pytest.skip(cpu_gdn.status()[1])
    config, params = moe_model
    k = 4
    seq = jax.random.randint(jax.random.key(7), (2, 6 + k + 1), 0, config.vocab_size)
    pre = models.prefill(config, params, seq[:, :6], capacity=32)
    snapshot, window = pre.state, seq[:, 6:]
    verified = models.window_step(config, params, snapshot, window, gdn_states=strategy == "states")
    commit = users_jit(commit_window, static_argnames=("strategy", "native"))
    for j in range(k + 2):
        n = jnp.asarray([j, k + 1 - j], jnp.int32)
        got = commit(snapshot, verified.state, verified.commit, n, strategy=strategy, native=native)
        # the same commit's gathered (tree) form along the chain's path, rows 0..k in place
        path = jnp.broadcast_to(jnp.arange(k + 1, dtype=jnp.int32), (2, k + 1))
        gathered = commit(
            snapshot, verified.state, verified.commit, n, strategy=strategy, native=native,
            rows=path,
        )  # fmt: skip
        fresh = models.window_step(config, params, snapshot, window, n).state
        np.testing.assert_array_equal(got.lengths, fresh.lengths)
        np.testing.assert_array_equal(gathered.lengths, fresh.lengths)
        for a, g, b in zip(got.layers, gathered.layers, fresh.layers, strict=True):
            if isinstance(a, GDNCache):
                assert rel_err(a.state, b.state) <= 1e-6, (strategy, j)
                assert rel_err(g.state, b.state) <= 1e-6, (strategy, j)
                np.testing.assert_array_equal(a.conv, b.conv)
                np.testing.assert_array_equal(g.conv, b.conv)
        # The committed state continues exactly like the full sequence's forward.
        nxt = jnp.asarray([1, 2], jnp.int32)
        logits = models.step(config, params, got, nxt).logits[:, 0]
        for i in range(2):
            own = jnp.concatenate([seq[i, : 6 + int(n[i])], nxt[i : i + 1]])
            want = models.forward(config, params, own[None])[0, -1]
            assert rel_err(logits[i], want) <= 1e-5, (strategy, j, i)


def test_negative_control_kv_only_rewind_leaves_gdn_state_wrong(moe_model):
    """Rewinding only the attention KV length (what a pure-attention engine does) is wrong here."""
    config, params = moe_model
    seq = jax.random.randint(jax.random.key(8), (1, 10), 0, config.vocab_size)
    pre = models.prefill(config, params, seq[:, :6], capacity=32)
    verified = models.window_step(config, params, pre.state, seq[:, 6:])
    n = jnp.asarray([2], jnp.int32)
    bad = rewind_kv_only(pre.state, verified.state, n)
    good = commit_window(pre.state, verified.state, verified.commit, n, "scan")
    want = models.forward(config, params, jnp.concatenate([seq[:, :8], seq[:, :1]], 1))[0, -1]
    good_logits = models.step(config, params, good, seq[:, 0]).logits[0, 0]
    bad_logits = models.step(config, params, bad, seq[:, 0]).logits[0, 0]
    assert rel_err(good_logits, want) <= 1e-5
    assert rel_err(bad_logits, want) > 1e-3
    bad_gdn = [c for c in bad.layers if isinstance(c, GDNCache)][0]
    good_gdn = [c for c in good.layers if isinstance(c, GDNCache)][0]
    assert rel_err(bad_gdn.state, good_gdn.state) > 1e-3


# ---- speculative greedy == plain greedy ---------------------------------------------------------


# Every (commit, k) pair, and every proposer with every commit and every k (a pairwise cover of
# proposer x commit x k: 12 programs where the full product compiles 24).
PAIRWISE = [
    (proposer, strategy, k)
    for i, k in enumerate([1, 2, 4, 7])
    for j, strategy in enumerate(["scan", "states", "replay"])
    for proposer in [("mtp", "ngram")[(i + j) % 2]]
]


@pytest.mark.parametrize("proposer, strategy, k", PAIRWISE)
def test_speculative_greedy_equals_plain_greedy(moe_model, plain_moe, proposer, strategy, k):
    config, params = moe_model
    spec = mtpspec.SpecConfig(proposer=proposer, num_draft=k, commit=strategy)
    result = mtpspec.generate(config, params, PROMPTS, max_new_tokens=24, speculative=spec)
    assert result.tokens == plain_moe.tokens
    assert result.stop_reasons == ["length", "length"]
    stats = result.stats
    assert len(stats["position_acceptance"]) == k
    assert 1.0 <= stats["tau"] <= k + 1
    emitted = sum(len(t) for t in result.tokens) - len(PROMPTS)  # prefill tokens excluded
    verify_tokens = sum(a + 1 for seq in stats["accepted"] for a in seq if a >= 0)
    assert verify_tokens >= emitted  # the last step may be cut at max_new_tokens
    # τ counts only what was emitted (tokens cut at max_new_tokens are not)
    assert stats["emitted"] == [len(t) - 1 for t in result.tokens]
    assert stats["tau"] == pytest.approx(emitted / sum(stats["steps"]))


def test_ngram_drafts_are_accepted_on_repetitive_text(moe_model, plain_moe):
    """Feed the model its own greedy output as prompt: n-gram drafts must hit, several in a row."""
    config, params = moe_model
    prompts = [PROMPTS[0] + plain_moe.tokens[0]]
    plain = mtpspec.generate(config, params, prompts, max_new_tokens=24)
    spec = mtpspec.SpecConfig(proposer="ngram", num_draft=4, commit="replay")
    result = mtpspec.generate(config, params, prompts, max_new_tokens=24, speculative=spec)
    assert result.tokens == plain.tokens
    assert result.stats["tau"] > 1.25
    assert max(result.stats["accepted"][0]) >= 2


@functools.cache
def fixture_model(name):
    config, params = checkpoints.load_hf(FIXTURES / name, dtype="float32")
    return config, params, np.load(FIXTURES / name / "reference.npz")


# Plain greedy on every fixture, and each speculative form on one of them (every family, both
# proposers and three commits are covered; the full product compiles twice as many programs).
FIXTURE_RUNS = [
    ("qwen3_next", None), ("qwen3_5", None), ("qwen3_5_moe", None),
    ("qwen3_next", ("mtp", 3, "scan")), ("qwen3_5", ("ngram", 2, "replay")),
    ("qwen3_5_moe", ("mtp", 2, "states")),
]  # fmt: skip


@pytest.mark.parametrize(
    "name, spec",
    FIXTURE_RUNS,
    ids=[f"{n}-{s[0] + '-' + s[2] if s else 'plain'}" for n, s in FIXTURE_RUNS],
)
def test_fixture_checkpoints_decode_exactly_like_transformers(name, spec):
    config, params, ref = fixture_model(name)
    prompts = ref["prompt_ids"].tolist()
    speculative = None if spec is None else mtpspec.SpecConfig(*spec)
    n = ref["generated_ids"].shape[1]
    result = mtpspec.generate(config, params, prompts, max_new_tokens=n, speculative=speculative)
    np.testing.assert_array_equal(np.asarray(result.tokens), ref["generated_ids"])


@settings(max_examples=4, deadline=None)
@given(
    data=st.data(),
    k=st.integers(1, 5),
    strategy=st.sampled_from(["scan", "states", "replay"]),
    proposer=st.sampled_from(["mtp", "ngram"]),
)
def test_fuzzed_prompts_and_configs_speculative_equals_plain(
    moe_model, data, k, strategy, proposer
):
    config, params = moe_model
    batch = data.draw(st.integers(1, 3))
    prompts = [
        data.draw(st.lists(st.integers(0, SMALL_VOCAB - 1), min_size=1, max_size=15))
        for _ in range(batch)
    ]
    max_new = data.draw(st.integers(1, 20))
    plain = mtpspec.generate(config, params, prompts, max_new_tokens=max_new)
    spec = mtpspec.SpecConfig(proposer=proposer, num_draft=k, commit=strategy)
    result = mtpspec.generate(config, params, prompts, max_new_tokens=max_new, speculative=spec)
    assert result.tokens == plain.tokens
    assert all(len(t) == max_new for t in result.tokens)


# ---- loop contracts -----------------------------------------------------------------------------


def test_a_64_token_generation_compiles_once(moe_model):
    config, params = moe_model
    spec = mtpspec.SpecConfig(proposer="ngram", num_draft=3, commit="scan")
    before = mtpspec.decoding.compile_count()
    first = mtpspec.generate(config, params, [[1, 2, 3]], max_new_tokens=64, speculative=spec)
    assert mtpspec.decoding.compile_count() == before + 1
    assert first.stats["compile_s"] > 0
    again = mtpspec.generate(config, params, [[3, 2, 1]], max_new_tokens=60, speculative=spec)
    assert mtpspec.decoding.compile_count() == before + 1  # same buckets: no recompile
    assert again.stats["compile_s"] == 0.0
    assert len(first.tokens[0]) == 64 and len(again.tokens[0]) == 60


def test_cpu_decoding_programs_compile_without_split_reductions(moe_model):
    """On CPU a decoding program is compiled with ``program.CPU_COMPILER_OPTIONS``: XLA's
    tree-reduction rewrite (every norm's reduction split into a reduce-window and a reduce,
    ~4 thunks per norm) is off, so the cached program has far fewer reduce-windows than the same
    lowering compiled with XLA's defaults."""
    from mtpspec.decoding import program

    if jax.default_backend() != "cpu":
        pytest.skip("CPU-only compiler options")
    assert program.compiler_options() == program.CPU_COMPILER_OPTIONS
    config, params = moe_model
    spec = mtpspec.SpecConfig(proposer="mtp", num_draft=2)
    prep = mtpspec.decoding.prepare(config, params, [[1, 2, 3]], max_new_tokens=8, speculative=spec)
    cached, _ = prep.compiled()  # through the program cache
    default = prep.lower().compile()

    def count(c):
        return c.as_text().count(" reduce-window(")

    assert count(cached) < count(default) / 2, (count(cached), count(default))


def test_prepared_prefill_and_step_are_the_programs_generate_compiles(moe_model):
    """``Prepared.prefill`` / ``.step`` (notebooks, the tree planner, stepping by hand) compile
    once each through the program cache and its counter, with decoding's compiler options (no
    split reductions, as ``generate``'s), and stepping by hand emits ``generate``'s tokens."""
    from mtpspec.decoding import program

    config, params = moe_model
    spec = mtpspec.SpecConfig(proposer="mtp", num_draft=2)
    prompts = [[1, 2, 3], [4, 5]]
    prep = mtpspec.decoding.prepare(config, params, prompts, max_new_tokens=8, speculative=spec)
    before = mtpspec.decoding.compile_count()
    carry = prep.prefill()
    for _ in range(prep.key.out_size):
        carry = prep.step(carry)
    assert mtpspec.decoding.compile_count() - before == 2  # one prefill, one step, cached
    want = mtpspec.generate(config, params, prompts, max_new_tokens=8, speculative=spec)
    got = [row[:n] for row, n in zip(np.asarray(carry.out).tolist(), carry.count.tolist())]
    assert got[: len(prompts)] == want.tokens
    if jax.default_backend() == "cpu":
        args = program.Program.step_args(prep.args, carry)
        step, compiled_now = prep.program.compiled(args, "step")
        assert not compiled_now and prep.program.window.depth == 2
        default = program.step_jit.lower(prep.key, *args).compile()
        count = lambda c: c.as_text().count(" reduce-window(")  # noqa: E731
        assert count(step) < count(default) / 2, (count(step), count(default))
    with pytest.raises(ValueError, match="unknown program part"):
        program.CACHE.get(prep.key, prep.args, "loop")


@pytest.mark.parametrize("k", [0, 3])
def test_capacity_stops_cleanly_with_a_status(moe_model, plain_moe, k):
    config, params = moe_model
    spec = mtpspec.SpecConfig(proposer="ngram", num_draft=k) if k else None
    result = mtpspec.generate(
        config, params, PROMPTS, max_new_tokens=24, speculative=spec, capacity=20
    )
    assert result.stop_reasons == ["capacity", "capacity"]
    for got, want in zip(result.tokens, plain_moe.tokens, strict=True):
        assert 1 <= len(got) < 24
        assert got == want[: len(got)]  # a clean prefix, no corruption


@pytest.mark.parametrize("spec", [None, ("ngram", 3, "replay"), ("mtp", 2, "scan")])
def test_eos_stops_each_sequence_at_its_first_eos(moe_model, plain_moe, spec):
    config, params = moe_model
    eos = plain_moe.tokens[0][5]
    speculative = None if spec is None else mtpspec.SpecConfig(*spec)
    result = mtpspec.generate(
        config, params, PROMPTS, max_new_tokens=24, speculative=speculative, eos_id=eos
    )
    for got, want, reason in zip(result.tokens, plain_moe.tokens, result.stop_reasons, strict=True):
        if eos in want:
            cut = want.index(eos) + 1
            assert got == want[:cut] and reason == "eos"
        else:
            assert got == want and reason == "length"


def test_streaming_yields_the_same_tokens(moe_model, plain_moe):
    config, params = moe_model
    spec = mtpspec.SpecConfig(proposer="ngram", num_draft=2, commit="states")
    pieces = list(
        mtpspec.generate_stream(config, params, PROMPTS, max_new_tokens=24, speculative=spec)
    )
    joined = [sum((p[i] for p in pieces), []) for i in range(len(PROMPTS))]
    assert joined == plain_moe.tokens
    assert len(pieces) > 2


def test_plain_sampling_is_reproducible_and_seeded(moe_model):
    config, params = moe_model
    kw = dict(max_new_tokens=16, temperature=1.0, top_k=5, top_p=0.9)
    a = mtpspec.generate(config, params, PROMPTS, seed=1, **kw)
    b = mtpspec.generate(config, params, PROMPTS, seed=1, **kw)
    c = mtpspec.generate(config, params, PROMPTS, seed=2, **kw)
    assert a.tokens == b.tokens
    assert a.tokens != c.tokens
    assert all(0 <= t < config.vocab_size for seq in a.tokens for t in seq)


def test_ngram_propose_matches_python_reference():
    rng = np.random.default_rng(0)
    for _ in range(30):
        size, k = 24, 3
        length = int(rng.integers(1, size))
        row = rng.integers(0, 3, size=size)
        hist = jnp.asarray(row[None], jnp.int32)
        got = np.asarray(ngram_propose(hist, jnp.asarray([length]), k, 1, 3))[0]
        seq = row[:length].tolist()
        want = [seq[-1]] * k
        for n in (3, 2, 1):
            if len(seq) <= n:
                continue
            suffix = seq[-n:]
            ends = [p for p in range(n - 1, length - 1) if seq[p - n + 1 : p + 1] == suffix]
            if ends:
                p = max(ends)
                want = [seq[p + 1 + i] if p + 1 + i < length else seq[-1] for i in range(k)]
                break
        assert got.tolist() == want, (seq, got, want)


def _bad_calls(config, params):
    spec = mtpspec.SpecConfig
    ok = dict(prompts=[[1, 2]], max_new_tokens=4)
    return [
        (dict(ok, speculative=spec(num_draft=0)), ValueError, "num_draft"),
        (dict(ok, speculative=spec(proposer="oracle")), ValueError, "unknown proposer"),
        (dict(ok, speculative=spec(commit="rewind")), ValueError, "unknown commit"),
        (dict(ok, speculative=spec(verify_method="fast")), ValueError, "verify_method"),
        (dict(ok, prompts=[[1, SMALL_VOCAB]]), ValueError, "outside the vocabulary"),
        (dict(ok, prompts=[[1, -1]]), ValueError, "outside the vocabulary"),
        (dict(ok, prompts=[[]]), ValueError, "prompt 0 is empty"),
        (dict(ok, prompts=[]), ValueError, "non-empty list"),
        (dict(ok, prompts=[[1.0, 2.0]]), TypeError, "non-integer token"),
        (dict(ok, prompts=np.zeros((1, 3), np.int32)), TypeError, "ragged batch"),
        (dict(ok, max_new_tokens=-1), ValueError, "max_new_tokens"),
        (dict(ok, max_new_tokens=2.0), TypeError, "max_new_tokens"),
        (dict(ok, temperature=-1.0), ValueError, "temperature"),
        (dict(ok, top_p=0.0), ValueError, "top_p"),
        (dict(ok, top_k=-2), ValueError, "top_k"),
        (dict(ok, eos_id=SMALL_VOCAB), ValueError, "eos_id"),
        (dict(ok, capacity=2), ValueError, "capacity"),
        (dict(ok, speculative="mtp"), TypeError, "SpecConfig"),
        (dict(ok, speculative=spec(proposer="draft")), ValueError, "needs draft_config"),
        (dict(ok, mesh=object()), TypeError, "jax.sharding.Mesh"),
    ]


def test_bad_arguments_raise_before_device_work(moe_model):
    config, params = moe_model
    before = mtpspec.decoding.compile_count()
    for kwargs, exc, match in _bad_calls(config, params):
        with pytest.raises(exc, match=match):
            mtpspec.generate(config, params, **kwargs)
    no_mtp = {k: v for k, v in params.items() if k != "mtp"}
    with pytest.raises(ValueError, match="MTP head"):
        mtpspec.generate(config, no_mtp, [[1]], max_new_tokens=2, speculative=mtpspec.SpecConfig())
    assert mtpspec.decoding.compile_count() == before


def test_zero_new_tokens_returns_empty(moe_model):
    config, params = moe_model
    result = mtpspec.generate(config, params, PROMPTS, max_new_tokens=0)
    assert result.tokens == [[], []]


def test_compile_cache_is_a_bounded_lru(moe_model):
    """Beyond ``set_compile_cache_size`` entries the least recently used program is dropped
    (and compiled again when asked for); recently used ones stay."""
    config, params = moe_model
    cache = mtpspec.decoding.program.CACHE
    old_size = cache.maxsize
    run = lambda n: mtpspec.generate(config, params, [[1, 2]], max_new_tokens=n)  # noqa: E731
    try:
        mtpspec.decoding.set_compile_cache_size(2)
        run(16), run(32)  # two programs (output buckets 16 and 32)
        before = mtpspec.decoding.compile_count()
        run(16)  # cached; now the most recently used
        assert mtpspec.decoding.compile_count() == before
        run(48)  # a third: evicts 32, the least recently used
        assert mtpspec.decoding.compile_count() == before + 1 and len(cache) == 2
        run(16)
        assert mtpspec.decoding.compile_count() == before + 1  # still cached
        run(32)
        assert mtpspec.decoding.compile_count() == before + 2  # was evicted: compiled again
        with pytest.raises(ValueError, match="cache size"):
            mtpspec.decoding.set_compile_cache_size(0)
    finally:
        mtpspec.decoding.set_compile_cache_size(old_size)


def test_live_mappings_are_counted_and_compiles_release_programs_near_the_limit(
    moe_model, monkeypatch, caplog
):
    """Near vm.max_map_count every compiled program is released before the next compile (with a
    warning), instead of letting XLA's compile fail and the process crash; below it, nothing is.
    ``release_compiled`` actually returns mappings to the kernel."""
    program = mtpspec.decoding.program
    if program.live_mappings() is None:
        pytest.skip("no /proc here")
    count, limit = program.live_mappings()
    assert 0 < count < limit
    config, params = moe_model
    run = lambda n: mtpspec.generate(config, params, [[3, 1]], max_new_tokens=n)  # noqa: E731
    run(7), run(23)  # two programs
    assert len(program.CACHE) >= 2
    before = program.live_mappings()[0]
    mtpspec.decoding.release_compiled()
    assert len(program.CACHE) == 0 and program.live_mappings()[0] < before - 500
    run(7)
    monkeypatch.setattr(program, "live_mappings", lambda: (int(0.69 * 65530), 65530))
    run(23)  # compiles, well below the headroom: the first program stays
    assert len(program.CACHE) == 2
    monkeypatch.setattr(program, "live_mappings", lambda: (int(0.9 * 65530), 65530))
    with caplog.at_level("WARNING", logger=program.__name__):
        run(39)  # a new program near the limit: everything before it is released
    assert len(program.CACHE) == 1 and "vm.max_map_count = 65530" in caplog.text


# ---- a new proposer is one module ---------------------------------------------------------------


def test_a_new_proposer_is_one_module_registered_from_outside(moe_model, plain_moe):
    """What docs/design.md promises: a proposer defined in one module (this test file), with no
    change anywhere else, runs in the on-device loop and keeps greedy exact. This one repeats the
    last token k times and carries a per-sequence count of its own proposals in its state."""
    import dataclasses
    from typing import ClassVar

    from mtpspec.decoding import proposers

    @proposers.register
    @dataclasses.dataclass(frozen=True)
    class RepeatProposer(proposers.Proposer):
        name: ClassVar[str] = "repeat_for_test"

        def init(self, s, params, pparams, pre, key):
            return jnp.zeros_like(pre.lengths), pre.state

        def propose(self, s, params, pparams, pstate, state, pending, active, key):
            drafts = jnp.tile(pending[:, None], (1, s.k))
            return proposers.Proposal(drafts, jnp.zeros(drafts.shape + (0,), jnp.float32))

        def update(self, s, params, pparams, pstate, scratch, done, key):
            return pstate + (done.n > 0), done.state

    try:
        config, params = moe_model
        spec = mtpspec.SpecConfig(proposer="repeat_for_test", num_draft=2)
        result = mtpspec.generate(config, params, PROMPTS, max_new_tokens=24, speculative=spec)
        assert result.tokens == plain_moe.tokens
        assert len(result.stats["position_acceptance"]) == 2
    finally:
        proposers.base._REGISTRY.pop("repeat_for_test")
