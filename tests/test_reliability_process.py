"""The user's process is theirs, and a dtype is honoured or refused (the reliability catalogue,
continued: tests/test_reliability.py has the API-boundary cases).

Each case is something a user meets in a notebook: their own jitted functions beside mtpspec's,
two threads decoding at once, a checkpoint loaded in another dtype. Where the failure was
silent, a negative control shows the test can see it.
"""

from __future__ import annotations

import dataclasses
import functools
import json
import pathlib
import subprocess
import sys
import threading

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import mtpspec
from mtpspec import checkpoints, decoding, models
from mtpspec import config as C
from mtpspec.decoding import program
from mtpspec.kernels import cpu_linear, settings
from mtpspec.kernels.settings import KernelSettings
from tests.conftest import subprocess_env

ROOT = pathlib.Path(__file__).resolve().parent.parent
HF_FIXTURE = ROOT / "tests" / "fixtures" / "hf" / "qwen3_5"
PROMPTS = [[1, 2, 3, 4, 5, 6, 7, 1, 2, 3], [5, 3]]


@pytest.fixture(scope="module")
def model():
    config = C.tiny_hybrid(
        vocab_size=32, layer_types=(C.LINEAR, C.FULL), mlp_types=("dense",) * 2, mtp_num_layers=1
    )
    return config, models.init_params(config, jax.random.key(5), norm_scale=0.1)


def _users_function():
    """A user's own jitted function and the number of times it was traced."""
    traces = []

    @jax.jit
    def user_step(x):
        traces.append(1)
        return jnp.tanh(x) * 2.0 + 1.0

    return user_step, traces


# ---- the user's jitted functions survive mtpspec ------------------------------------------------


def test_releasing_mtpspecs_programs_keeps_the_users_jitted_functions(model):
    config, params = model
    user_step, traces = _users_function()
    x = jnp.arange(8.0)
    want = user_step(x)
    mtpspec.generate(config, params, PROMPTS, max_new_tokens=6)
    compiles = decoding.compile_count()
    decoding.release_compiled(weights=True)
    assert len(program.CACHE) == 0
    np.testing.assert_array_equal(user_step(x), want)
    assert len(traces) == 1 and user_step._cache_size() == 1  # neither traced nor compiled again
    # mtpspec's own program was released: the same call compiles again
    mtpspec.generate(config, params, PROMPTS, max_new_tokens=6)
    assert decoding.compile_count() == compiles + 1
    # negative control: emptying every cache in the process does retrace the user's function
    jax.clear_caches()
    user_step(x)
    assert len(traces) == 2


def test_the_map_pressure_relief_releases_only_mtpspecs_programs(model, monkeypatch):
    config, params = model
    user_step, traces = _users_function()
    x = jnp.ones(4)
    user_step(x)
    mtpspec.generate(config, params, PROMPTS, max_new_tokens=6)
    monkeypatch.setattr(program, "live_mappings", lambda: (int(0.9 * 65530), 65530))
    assert program.relieve_map_pressure()
    assert len(program.CACHE) == 0
    user_step(x)
    assert len(traces) == 1 and user_step._cache_size() == 1


_SNAPSHOT = """
import json, logging, sys
import jax

def snapshot():
    names = ("", "jax", "absl", "mtpspec", "jax._src.xla_bridge")
    return {
        "config": {k: repr(v) for k, v in sorted(jax.config.values.items())},
        "loggers": {n: [logging.getLogger(n).level, len(logging.getLogger(n).handlers)]
                    for n in names},
    }

before = snapshot()
import jax.numpy as jnp
import mtpspec
from mtpspec import config as C, decoding, models
config = C.tiny_hybrid(vocab_size=32, layer_types=(C.LINEAR, C.FULL), mlp_types=("dense",) * 2,
                       mtp_num_layers=1)
params = models.init_params(config, jax.random.key(0), norm_scale=0.1)
mtpspec.generate(config, params, [[1, 2, 3]], max_new_tokens=4)
mtpspec.generate(config, params, [[1, 2, 3]], max_new_tokens=4,
                 speculative=decoding.SpecConfig(num_draft=2))
list(mtpspec.generate_stream(config, params, [[1, 2, 3]], max_new_tokens=3))
decoding.release_compiled(weights=True)
json.dump({"before": before, "after": snapshot()}, sys.stdout)
"""


def test_generating_changes_no_jax_config_and_no_logging_set_up():
    done = subprocess.run(
        [sys.executable, "-c", _SNAPSHOT],
        cwd=ROOT,
        env=subprocess_env(),
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert done.returncode == 0, done.stderr[-2000:]
    got = json.loads(done.stdout)
    # the suite's own settings arrive through JAX_* variables, read before the snapshot
    assert got["after"]["config"] == got["before"]["config"]
    assert got["after"]["loggers"] == got["before"]["loggers"]


@pytest.mark.skipif(not cpu_linear.available(), reason=cpu_linear.status()[1])
def test_changing_a_kernel_setting_after_a_compile_compiles_a_new_program(model):
    """A notebook runs a generate under other kernel settings (one thread, the other ISA) after a
    first one: the next call must compile a program whose kernel calls carry the new values, not
    silently reuse the old one. Same tokens (threads change no bit; the ISA only where both
    exist: it may change last bits, so only the tokens of a greedy run are compared); back to
    the first settings reuses the first program; the negative control: equal settings built
    anew compile nothing."""
    config, params = model
    run = functools.partial(
        decoding.generate, config, params, PROMPTS, max_new_tokens=6, linear="ffi",
        speculative=decoding.SpecConfig("mtp", 2),
    )  # fmt: skip
    prepare = functools.partial(
        decoding.prepare, config, params, PROMPTS, max_new_tokens=6, linear="ffi",
        speculative=decoding.SpecConfig("mtp", 2),
    )  # fmt: skip
    first = run().tokens
    before = decoding.compile_count()
    with settings.use(dataclasses.replace(settings.current())):  # equal value, new object
        assert run().tokens == first and decoding.compile_count() == before
    one = KernelSettings(settings.current().isa, 1, 1, 1)
    with settings.use(one):
        assert run().tokens == first
        assert decoding.compile_count() == before + 1
        key = prepare().key
        assert key.backend.kernels == one
        text = prepare().lower().as_text()
    calls = text.count("threads = ")
    assert calls > 0 and text.count("threads = 1 : i64") == calls  # every kernel call
    other = "avx2" if settings.current().isa == "avx512" else "avx512"
    if settings.has_avx512():
        with settings.use(KernelSettings(other)):
            assert run().tokens == first
            assert decoding.compile_count() == before + 2
    else:
        with pytest.raises(OSError, match="AVX-512F"), settings.use(KernelSettings(other)):
            pass
    compiled = decoding.compile_count()
    assert run().tokens == first and decoding.compile_count() == compiled


def test_other_compiler_options_are_another_program(model, monkeypatch):
    """The XLA options a decoding program is compiled with are part of its cache entry: a
    program compiled under other options is never handed out for these, and back to the first
    options reuses the first program."""
    from mtpspec.decoding import program

    if jax.default_backend() != "cpu":
        pytest.skip("decoding's compiler options are CPU options")
    config, params = model
    run = functools.partial(decoding.generate, config, params, PROMPTS, max_new_tokens=6)
    first = run().tokens
    before = decoding.compile_count()
    level = program.CPU_COMPILER_OPTIONS.get("xla_backend_optimization_level", 3)
    with monkeypatch.context() as m:
        m.setitem(program.CPU_COMPILER_OPTIONS, "xla_backend_optimization_level", 0 if level else 3)
        assert run().tokens == first and decoding.compile_count() == before + 1
    assert run().tokens == first and decoding.compile_count() == before + 1


def test_equal_spec_configs_are_equal(model):
    """A notebook builds ``SpecConfig("mtp", 2)`` twice: the two are equal and hash alike (they
    compared by identity before); a different setting or another draft-weights object is not
    equal; weights are compared by identity, never element by element."""
    config, params = model
    a, b = decoding.SpecConfig("mtp", 2), decoding.SpecConfig("mtp", 2)
    assert a == b and hash(a) == hash(b) and len({a, b}) == 1
    assert a != decoding.SpecConfig("mtp", 3) and a != decoding.SpecConfig("mtp", 2, tree=(1, 1))
    draft = dict(draft_config=config, draft_params=params)
    assert decoding.SpecConfig("draft", 2, **draft) == decoding.SpecConfig("draft", 2, **draft)
    copied = jax.tree.map(jnp.copy, params)
    assert decoding.SpecConfig("draft", 2, **draft) != decoding.SpecConfig(
        "draft", 2, draft_config=config, draft_params=copied
    )
    assert a != "mtp"


# ---- threads -------------------------------------------------------------------------------------


def test_two_threads_generating_at_once_give_the_sequential_tokens(model):
    config, params = model
    calls = [
        dict(max_new_tokens=9),
        dict(max_new_tokens=9, speculative=decoding.SpecConfig(num_draft=2)),
        dict(max_new_tokens=7, temperature=0.8, seed=4),
    ]
    decoding.release_compiled(weights=True)  # both threads compile and build weights at once
    results: dict[int, list] = {}
    errors: list[BaseException] = []

    def work(i):
        try:
            results[i] = mtpspec.generate(config, params, PROMPTS, **calls[i % 3]).tokens
        except BaseException as e:  # noqa: BLE001 - reported below
            errors.append(e)

    threads = [threading.Thread(target=work, args=(i,)) for i in range(6)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=600)
    assert not errors, errors
    assert not any(t.is_alive() for t in threads)
    for i in range(6):
        assert results[i] == mtpspec.generate(config, params, PROMPTS, **calls[i % 3]).tokens


# ---- a dtype is honoured or refused, for every checkpoint kind -----------------------------------


@pytest.fixture(scope="module")
def saved(model, tmp_path_factory):
    config, params = model
    d = tmp_path_factory.mktemp("saved") / "ckpt"
    checkpoints.save_params(d, config, params)
    return d


def _kinds(saved):
    return {"mtpspec": saved, "hf": HF_FIXTURE}


@pytest.mark.parametrize("kind", ["mtpspec", "hf"])
@pytest.mark.parametrize("dtype", ["int8", "float16", "fp32", np.int8, 3, "bf16"])
def test_an_unsupported_dtype_is_refused_by_name_for_every_checkpoint_kind(saved, kind, dtype):
    with pytest.raises(ValueError, match=r"dtype must be one of \('float32', 'bfloat16'\), got"):
        checkpoints.load(_kinds(saved)[kind], dtype=dtype)


@pytest.mark.parametrize("kind", ["mtpspec", "hf"])
@pytest.mark.parametrize("dtype", ["bfloat16", jnp.bfloat16])
def test_bfloat16_is_cast_on_load_for_every_checkpoint_kind(saved, kind, dtype):
    path = _kinds(saved)[kind]
    config32, params32 = checkpoints.load(path, dtype="float32")
    config, params = checkpoints.load(path, dtype=dtype)
    assert config.dtype == "bfloat16" and config32.dtype == "float32"
    leaves, leaves32 = jax.tree.leaves(params), jax.tree.leaves(params32)
    assert all(x.dtype == jnp.bfloat16 for x in leaves)
    for x, x32 in zip(leaves, leaves32, strict=True):  # the f32 weights rounded, nothing else
        np.testing.assert_array_equal(np.asarray(x), np.asarray(x32.astype(jnp.bfloat16)))
    assert dataclasses.replace(config, dtype="float32") == config32


def test_a_mtpspec_checkpoint_keeps_its_own_dtype_with_none(saved, tmp_path):
    config, params = checkpoints.load(saved, dtype="bfloat16")
    checkpoints.save_params(tmp_path / "bf16", config, params)
    own_cfg, own = checkpoints.load(tmp_path / "bf16", dtype=None)
    assert own_cfg.dtype == "bfloat16"
    assert all(x.dtype == jnp.bfloat16 for x in jax.tree.leaves(own))
    up_cfg, up = checkpoints.load(tmp_path / "bf16")  # the default: float32
    assert up_cfg.dtype == "float32" and all(x.dtype == jnp.float32 for x in jax.tree.leaves(up))


def test_a_bfloat16_load_decodes(saved):
    config, params = checkpoints.load(saved, dtype="bfloat16")
    out = mtpspec.generate(config, params, PROMPTS, max_new_tokens=5)
    assert [len(t) for t in out.tokens] == [5, 5]
