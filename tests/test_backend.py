"""The backend value: the kernels' settings (``kernels.settings``) and the resolved ``Backend`` of
a decoding program (``decoding.backend``)."""

from __future__ import annotations

import dataclasses
import threading

import jax
import numpy as np
import pytest

from mtpspec.decoding import backend
from mtpspec.decoding.backend import Backend
from mtpspec.kernels import cpu_linear, settings
from mtpspec.kernels.settings import KernelSettings

built = pytest.mark.skipif(not cpu_linear.available(), reason=cpu_linear.status()[1])


def test_settings_check_their_values():
    assert KernelSettings() == KernelSettings() and hash(KernelSettings()) == hash(KernelSettings())
    assert KernelSettings(linear_threads=1) != KernelSettings()
    for bad, error, match in [
        (dict(isa="sse2"), ValueError, "isa 'sse2'"),
        (dict(linear_threads=0), ValueError, "linear_threads must be in 1..64"),
        (dict(gdn_threads=True), TypeError, "gdn_threads must be an int"),
        (dict(attention_threads=2.0), TypeError, "attention_threads must be an int"),
        (dict(prefetch=-1), ValueError, "prefetch must be in 0..4096"),
    ]:
        with pytest.raises(error, match=match):
            KernelSettings(**bad)
    with pytest.raises(TypeError, match="KernelSettings"), settings.use("avx2"):
        pass


def test_settings_from_the_environment_name_the_bad_variable():
    env = {"MTPSPEC_CPU_LINEAR_THREADS": "1", "MTPSPEC_CPU_LINEAR_ISA": "avx2", "OTHER": "x"}
    assert KernelSettings.from_env(env) == KernelSettings(isa="avx2", linear_threads=1)
    assert KernelSettings.from_env({}) == KernelSettings()
    with pytest.raises(ValueError, match="MTPSPEC_CPU_GDN_THREADS='two' is not an integer"):
        KernelSettings.from_env({"MTPSPEC_CPU_GDN_THREADS": "two"})
    with pytest.raises(ValueError, match="MTPSPEC_CPU_ATTENTION_THREADS='0'"):
        KernelSettings.from_env({"MTPSPEC_CPU_ATTENTION_THREADS": "0"})
    with pytest.raises(ValueError, match="MTPSPEC_CPU_LINEAR_ISA='neon'"):
        KernelSettings.from_env({"MTPSPEC_CPU_LINEAR_ISA": "neon"})


def test_current_settings_are_resolved_scoped_and_thread_local():
    outside = settings.current()
    assert outside.isa in ("avx2", "avx512") and outside == settings.from_environment()
    seen = {}
    with settings.use(KernelSettings(isa="avx2", linear_threads=1)) as ks:
        assert settings.current() == ks == KernelSettings(isa="avx2", linear_threads=1)
        worker = threading.Thread(target=lambda: seen.setdefault("other", settings.current()))
        worker.start()
        worker.join()
        with settings.use(KernelSettings(isa="avx2", gdn_threads=1)):
            assert settings.current().linear_threads == 2  # the inner value, whole
    assert seen["other"] == outside  # another thread does not see this thread's block
    assert settings.current() == outside


@built
def test_a_nested_jitted_helper_is_traced_again_under_other_settings():
    """A module-level knob read at trace time is invisible to JAX's caches: a jitted helper
    called inside another jitted function kept the first trace's value whatever the knob said
    later. ``settings.use`` is a JAX user context, part of the trace and compile cache keys, so
    the same functions traced under other settings carry the new values."""
    rng = np.random.default_rng(0)
    x = rng.standard_normal((3, 40)).astype(np.float32)
    wp = cpu_linear.pack(rng.standard_normal((40, 24)).astype(np.float32))
    inner = jax.jit(lambda a, b: cpu_linear.apply(a, b, 24))
    outer = jax.jit(lambda a, b: inner(a, b) * 2.0)
    results = {}
    for threads, prefetch in ((1, 0), (2, 64), (1, 0)):
        with settings.use(KernelSettings(linear_threads=threads, prefetch=prefetch)):
            text = outer.lower(x, wp).as_text()
            assert f"threads = {threads} : i64" in text and f"prefetch = {prefetch} : i64" in text
            results[threads] = np.asarray(outer(x, wp))
    np.testing.assert_array_equal(results[1], results[2])  # threads and prefetch change no bit


def test_the_backend_is_a_checked_value():
    b = Backend(linear="ffi", attention="xla", verify="ffi", prefill="chunk")
    assert b.native and not dataclasses.replace(b, verify="recurrent").native
    assert b == Backend(linear="ffi", attention="xla", verify="ffi", prefill="chunk")
    assert len({b, dataclasses.replace(b)}) == 1
    assert b.kernels == settings.current()
    for bad, match in [
        (dict(linear="fast"), "Backend.linear"),
        (dict(attention="auto"), "Backend.attention"),
        (dict(verify="warp"), "Backend.verify"),
        (dict(kernels=KernelSettings()), "resolved KernelSettings"),  # isa "auto"
    ]:
        with pytest.raises(ValueError, match=match):
            dataclasses.replace(b, **bad)


def test_an_explicit_kernel_that_cannot_run_raises_when_the_backend_is_resolved(monkeypatch):
    from mtpspec import config as C
    from mtpspec.kernels import cpu_attention

    config = C.tiny_hybrid()
    monkeypatch.setattr(cpu_attention.KERNEL, "status", lambda: (False, "not built here"))
    args = dict(linear="xla", verify_method="auto", window=3, prefill=16, sharded=False)
    with pytest.raises(OSError, match="not built here"):
        backend.resolve(config, attention="ffi", **args)
    assert backend.resolve(config, attention="auto", **args).attention == "xla"  # said, logged
    with pytest.raises(ValueError, match="cannot run under a device mesh"):
        backend.resolve(config, attention="ffi", **{**args, "sharded": True})


@built
@pytest.mark.parametrize("kernel", ["tree", "commit"])
def test_a_native_window_whose_kernel_cannot_run_raises_instead_of_falling_back(
    kernel, monkeypatch
):
    """Where the verify window resolved to the C++ GDN kernel, a tree window's GDN and the
    "replay" commit run theirs too; one that cannot run raises OSError while the program is
    traced, never an XLA form in its place. Negative control: with the kernel there, the same
    call decodes."""
    import jax

    from mtpspec import config as C
    from mtpspec import decoding, models
    from mtpspec.kernels import cpu_gdn

    config = C.tiny_hybrid(vocab_size=64, layer_types=(C.LINEAR, C.FULL), mlp_types=("dense",) * 2)
    params = models.init_params(config, jax.random.key(4), norm_scale=0.1)
    spec = dict(tree=decoding.SpecConfig("mtp", 2, tree=(2, 1)))
    spec["commit"] = decoding.SpecConfig("mtp", 2, commit="replay", verify_method="ffi")
    target = dict(tree=cpu_gdn.TREE_KERNEL, commit=cpu_gdn.COMMIT_KERNEL)[kernel]
    run = lambda: decoding.generate(  # noqa: E731
        config, params, [[3, 1, 4, 1, 5]], max_new_tokens=5, speculative=spec[kernel]
    )
    prepared = decoding.prepare(
        config, params, [[3, 1, 4, 1, 5]], max_new_tokens=5, speculative=spec[kernel]
    )
    assert prepared.key.backend.native
    decoding.release_compiled()  # a program compiled before would not be traced again
    monkeypatch.setattr(target, "status", lambda: (False, "not built here"))
    with pytest.raises(OSError, match="not built here"):
        run()
    monkeypatch.undo()
    assert len(run().tokens[0]) == 5


def test_a_missing_library_warns_once_at_first_use_and_the_status_command_says_why(monkeypatch):
    """Without the kernels, decoding's "auto" on CPU runs XLA's forms and says so once per
    process: a RuntimeWarning naming the kernels, the reason and the cost. ``python -m
    mtpspec.kernels`` prints the same reason and exits 1; with the library, every target's status
    and exit 0."""
    import warnings

    from mtpspec.kernels import __main__ as status_command
    from mtpspec.kernels import library
    from mtpspec.models import inference

    real_status = library.status()
    monkeypatch.setattr(library, "_warned", set())
    monkeypatch.setattr(library, "status", lambda: (False, "no library here (simulated)"))
    monkeypatch.setattr(cpu_linear.KERNEL, "status", library.status)
    with pytest.warns(RuntimeWarning, match=r"unavailable: no library here \(simulated\)") as w:
        assert inference.resolve_linear("auto", platform="cpu") == "xla"
    assert "slower" in str(w[0].message) and "python -m mtpspec.kernels" in str(w[0].message)
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # a second decoding call: no second warning
        assert inference.resolve_linear("auto", platform="cpu") == "xla"
        assert inference.resolve_linear("xla", platform="cpu") == "xla"
    ok, lines = status_command.report()
    assert not ok and lines[0] == "library: no library here (simulated)"
    assert status_command.main() == 1
    monkeypatch.undo()
    ok, lines = status_command.report()
    assert ok == real_status[0]
    if ok:  # the machine's own library: every FFI target listed with its status
        assert lines[1:13] == [f"  {t}: ok" for t in (
            "mtpspec_cpu_linear", "mtpspec_cpu_linear_bf16", "mtpspec_cpu_linear_s8",
            "mtpspec_cpu_head_argmax", "mtpspec_cpu_head_argmax_bf16", "mtpspec_cpu_screen",
            "mtpspec_cpu_screen_bf16",
            "mtpspec_cpu_gdn", "mtpspec_cpu_gdn_tree", "mtpspec_cpu_gdn_commit",
            "mtpspec_cpu_attention", "mtpspec_cpu_tree_attention",
        )]  # fmt: skip
        assert lines[13].startswith("cpu: ") and lines[14].startswith("settings: KernelSettings(")
