"""mtpspec.analysis (the benchmark's arithmetic) and a miniature run of bench_speculative."""

from __future__ import annotations

import json
import os
import pathlib
import subprocess
import sys

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from mtpspec import analysis, models
from mtpspec import config as C
from tests import conftest

ROOT = pathlib.Path(__file__).resolve().parent.parent


def test_expected_tau_matches_monte_carlo_of_the_iid_model():
    rng = np.random.default_rng(0)
    for alpha, k in ((0.3, 1), (0.7, 3), (0.9, 5)):
        accept = rng.random((200_000, k)) < alpha
        a = np.cumprod(accept, axis=1).sum(axis=1)  # accepted prefix length
        assert abs((1 + a).mean() - float(analysis.expected_tau(alpha, k))) < 0.01
    assert float(analysis.expected_tau(1.0, 4)) == 5.0
    assert float(analysis.expected_tau(0.0, 4)) == 1.0


def test_fit_alpha_recovers_alpha_and_rejects_bad_input():
    runs = [[0.6**i for i in range(1, k + 1)] for k in (1, 2, 4)]
    assert abs(analysis.fit_alpha(runs) - 0.6) < 1e-4
    # a chain whose acceptance collapses is fitted somewhere between its first and later rates
    a = analysis.fit_alpha([[0.84, 0.30, 0.08]])
    assert 0.3 < a < 0.84
    with pytest.raises(ValueError, match="at least one"):
        analysis.fit_alpha([[]])
    with pytest.raises(ValueError, match=r"\[0, 1\]"):
        analysis.fit_alpha([[1.2]])


def test_ideal_speedup_definition():
    assert analysis.ideal_speedup(2.0, 1.0, 1.5, 0.5) == pytest.approx(1.0)
    assert analysis.ideal_speedup(3.0, 2.0, 2.0, 1.0) == pytest.approx(2.0)


def test_compile_counter_sees_compiles_and_nothing_else():
    f = jax.jit(lambda x: jnp.sin(x) * 3)
    x = jnp.arange(5.0)
    f(x)
    with analysis.CompileCounter() as counter:
        f(x)  # cached: no compile
    assert counter.count == 0
    y = jnp.arange(7.0)
    with analysis.CompileCounter() as counter:
        f(y)  # new shape: one compile
    assert counter.count == 1


def test_piece_costs_rejects_bad_arguments_before_any_work():
    config = C.tiny_moe(vocab_size=32, **C.TWO_LAYERS)
    params = models.init_params(config, jax.random.key(0))
    with pytest.raises(ValueError, match="k must be"):
        analysis.piece_costs(config, params, [1, 2], 0)
    with pytest.raises(ValueError, match="prompt"):
        analysis.piece_costs(config, params, [], 1)


@pytest.mark.slow(90)
def test_bench_speculative_miniature_run_writes_the_promised_json(tmp_path):
    out = tmp_path / "bench.json"
    cmd = [
        sys.executable, "-m", "experiments.bench_speculative",
        "--checkpoint=tests/fixtures/hf/qwen3_5", "--num_draft=1", "--commit=states,replay",
        "--max_new_tokens=16", "--repeats=1", "--piece_iters=2", "--num_prompts=1",
        "--peer_hf=off", f"--json_out={out}", f"--plot_dir={tmp_path}", "--max_window=3",
        "--tree=2x1",
    ]  # fmt: skip
    proc = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr[-3000:]
    result = json.loads(out.read_text())
    for key in ("speedup", "tau", "verify_over_step", "efficiency", "recompiles", "sweep"):
        assert key in result, key
    assert result["recompiles"] == 0
    assert result["valid"] is (not result["invalid"]) and np.isfinite(result["other_cpu"])
    assert all(r["speedup_iqr"][0] <= r["speedup_iqr"][1] for r in result["sweep"])
    assert {r["proposer"] for r in result["sweep"]} == {"mtp", "ngram"}
    assert all(r["same_as_greedy"] for r in result["sweep"])
    assert 1.0 <= result["tau"] <= 2.0
    assert (tmp_path / "speedup_tau_vs_k.png").stat().st_size > 10_000
    pieces = result["pieces"]["1"]
    for key in ("step", "verify", "commit_states", "commit_replay", "draft_mtp", "draft_ngram"):
        assert np.isfinite(pieces[key]) and pieces[key] > 0, key
    # "states" keeps every per-position GDN state: strictly more commit data than "replay"
    assert pieces["commit_data_bytes_states"] > pieces["commit_data_bytes_replay"] > 0
    # the tree swept beside the chains: its nodes, its window ÷ step, its plot
    (tree,) = [r for r in result["sweep"] if r["tree"] is not None]
    assert tree["tree"] == [2, 1] and tree["nodes"] == 4 and tree["proposer"] == "mtp"
    assert result["tree_costs"]["tree"]["2x1"] > 0 and result["tree_costs"]["chain"]["1"] == 1.0
    assert (tmp_path / "tau_speedup_vs_nodes.png").stat().st_size > 10_000
    for r in result["sweep"]:
        assert r["speedup"] > 0
        if r["tree"] is not None:  # its draft cost is not split out: no ideal
            assert np.isnan(r["ideal"]) and np.isnan(r["efficiency"])
            continue
        assert r["ideal"] > 0
        if np.isfinite(r["decode_speedup"]):
            assert r["efficiency"] == pytest.approx(r["decode_speedup"] / r["ideal"])
        else:  # flagged: prefill dominated this tiny run, so decode speed is not resolvable
            assert np.isnan(r["efficiency"])
    # the linear implementations side by side: r(t) for t = 1..3, pieces for t = 1 and 2
    linears = result["linears"]
    assert linears["impls"][0] == "xla"
    for impl in linears["impls"]:
        assert set(linears["window_over_step"][impl]) == {"1", "2", "3"}
        assert linears["window_over_step"][impl]["1"] == 1.0
        for t in ("1", "2"):
            row = linears["decomposition_s"][impl][t]
            for piece in ("attention", "gdn", "mlp", "lm_head", "model"):
                assert row[piece] > 0, (impl, t, piece)
    if len(linears["impls"]) > 1:  # the kernel is built: plain greedy with XLA's dots swept too
        assert result["plain_linears"]["same_tokens"]


def _row(speedup, tau, r, efficiency, tree=None):
    return dict(proposer="ngram", num_draft=2, commit="replay", tree=tree, tau=tau,
                decode_speedup=speedup, verify_over_step=r, efficiency=efficiency)  # fmt: skip


def test_self_checks_flag_the_impossible_run_and_pass_a_physical_one():
    """The run the issue quoted: n-gram k = 2 at 2.72x with tau 1.645 and efficiency 1.99, the
    plain loop at 3.46 ms/token against its 2.03 ms step piece. Every one of its figures is
    flagged; a run inside the physics (and a tree row without an efficiency) passes."""
    t_step = 2.03e-3
    bad = analysis.self_checks([_row(2.72, 1.645, 1.2, 1.99)], 1 / 3.46e-3, t_step)
    assert len(bad) == 3, bad
    assert "plain loop 3.460 ms/token is 1.70x" in bad[0]
    assert "efficiency 1.99 outside" in bad[1] and "above tau / r" in bad[2]
    good = [_row(1.25, 1.645, 1.2, 0.93), _row(1.1, 1.4, 1.2, float("nan"), tree=(2, 1))]
    assert analysis.self_checks(good, 1 / 2.1e-3, t_step) == []
    # each check alone, at its edge
    assert len(analysis.self_checks([_row(1.0, 1.645, 1.2, 0.79)], 1 / 2.0e-3, t_step)) == 1
    assert len(analysis.self_checks([_row(1.0, 1.645, 1.2, 0.9)], 1 / 2.3e-3, t_step)) == 1
    tree = _row(1.5, 1.4, 1.0, float("nan"), tree=(2, 1))
    assert "mtp tree 2x1" in analysis.self_checks([tree], 1 / 2.0e-3, t_step)[0]


def test_machine_load_reads_a_share_of_the_cpu():
    """A child process spinning for 0.5 s is another process's CPU time: it shows in
    ``MachineLoad.other`` (at least a third of one core's share of the wall time), which stays
    within [-0.1, 1.1]: tick counters are good to a few ticks either way (a fresh-clone run
    read 1.008 on 2026-12-06, a tick over a fully busy half second on 2 cores)."""
    spin = "import time\nt = time.time()\nwhile time.time() - t < 0.5: pass"
    with analysis.MachineLoad() as load:
        subprocess.run([sys.executable, "-c", spin], check=True)
    assert -0.1 <= load.other <= 1.1
    assert load.other > 1 / 3 / (os.cpu_count() or 1), load.other


def test_acceptance_by_context_position_by_hand():
    from mtpspec.decoding.stats import by_context_position

    # prompt 5: steps start at 6, then 6+3=9, 9+1=10, 10+4=14 (−1: inactive, skipped)
    # prompt 1: steps start at 2, 2+2=4
    rows = by_context_position([5, 1], [[2, 0, 3, 1, -1], [1, 0]], k=3, bucket=8)
    assert [r["start"] for r in rows] == [0, 8]
    first, second = rows
    assert first["steps"] == 3 and first["tau"] == pytest.approx((3 + 2 + 1) / 3)  # 6, 2, 4
    assert first["position_acceptance"] == pytest.approx([2 / 3, 1 / 3, 0.0])
    assert second["steps"] == 3 and second["tau"] == pytest.approx((1 + 4 + 2) / 3)  # 9, 10, 14
    assert second["position_acceptance"] == pytest.approx([2 / 3, 1 / 3, 1 / 3])
    # what an adapting draft length chose, per step: averaged per range beside τ
    drafted = [[3, 1, 3, 2, -1], [2, 1]]
    with_drafts = by_context_position([5, 1], [[2, 0, 3, 1, -1], [1, 0]], 3, 8, drafted=drafted)
    assert [r["mean_drafted"] for r in with_drafts] == pytest.approx([(3 + 2 + 1) / 3, 2.0])
    assert [r["tau"] for r in with_drafts] == [r["tau"] for r in rows]
    assert "mean_drafted" not in first
    with pytest.raises(ValueError, match="one entry per step"):
        by_context_position([5, 1], [[2, 0], [1, 0]], 3, 8, drafted=[[3, 1], [2]])
    with pytest.raises(ValueError, match="bucket must be"):
        by_context_position([5], [[1]], k=1, bucket=0)
    with pytest.raises(ValueError, match="prompt lengths"):
        by_context_position([5, 6], [[1]], k=1, bucket=4)


@pytest.mark.slow(20)
def test_acceptance_reports_what_an_adapting_draft_length_chose_by_context_position(tmp_path):
    """experiments.acceptance with --p_min / --adaptive: the fixed chain and the adapting
    configurations, each with its drafts per step overall and per context range (the adaptive
    policy's chosen k against context position)."""
    out = tmp_path / "acc.json"
    cmd = [
        sys.executable, "-m", "experiments.acceptance", "--num_draft=2", "--p_min=0.5",
        "--adaptive", "--max_new_tokens=32", "--by_position=16", f"--json_out={out}",
    ]  # fmt: skip
    proc = subprocess.run(
        cmd, cwd=ROOT, env=conftest.subprocess_env(), capture_output=True, text=True, timeout=600
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    rows = {r["label"]: r for r in json.loads(out.read_text())}
    assert set(rows) == {"mtp k=2", "mtp k=2 p>=0.5", "mtp k=2 adaptive", "mtp k=2 adaptive p>=0.5"}
    assert rows["mtp k=2"]["mean_drafted"] == 2.0  # a fixed chain drafts k every step
    assert rows["mtp k=2 p>=0.5"]["mean_drafted"] < 2.0  # the cut shortens some windows
    for r in rows.values():
        assert r["by_position"] and 1.0 <= r["tau"] <= 3.0
        for b in r["by_position"]:
            assert 0.0 <= b["mean_drafted"] <= 2.0 and b["steps"] > 0
        assert "drafts per step" in proc.stdout


def test_loop_profile_maps_thunks_to_targets_and_source_functions():
    """``experiments.investigations.loop_profile``'s HLO reading, on a hand-written module: FFI
    calls to their targets (the linear by its rows), fusions to their source functions innermost
    first."""
    from experiments.investigations import loop_profile

    hlo = "\n".join(
        [
            "HloModule jit_run",
            "",
            "FileNames",
            '1 "/x/mtpspec/models/layers.py"',
            '2 "/x/mtpspec/ops/norms.py"',
            "",
            "FunctionNames",
            '1 "decoder_layer"',
            '2 "rms_norm"',
            "",
            "FileLocations",
            "1 {file_name_id=1 function_name_id=1 line=10 end_line=10 column=1 end_column=2}",
            "2 {file_name_id=2 function_name_id=2 line=20 end_line=20 column=1 end_column=2}",
            "",
            "StackFrames",
            "1 {file_location_id=1 parent_frame_id=1}",
            "2 {file_location_id=2 parent_frame_id=1}",
            "",
            "ENTRY %main {",
            "  %ffi_call.3 = f32[4,256]{1,0} custom-call(%a, %b), "
            'custom_call_target="mtpspec_cpu_linear"',
            "  %ffi_call.4 = (f32[1,4,4,64]{3,2,1,0}, f32[1]{0}) custom-call(%c), "
            'custom_call_target="mtpspec_cpu_gdn"',
            "  %add_rsqrt_fusion.2 = f32[4]{0} fusion(%d), kind=kLoop, calls=%f, "
            'metadata={op_name="jit(run)/rsqrt" stack_frame_id=2}',
            "  %copy.1 = f32[4]{0} copy(%e)",
            "}",
        ]
    )
    assert loop_profile.ffi_targets(hlo) == {
        "ffi_call.3": "linear, 4 rows",
        "ffi_call.4": "mtpspec_cpu_gdn",
    }
    frames = loop_profile.source_frames(hlo)
    assert frames["add_rsqrt_fusion.2"] == ["rms_norm", "decoder_layer"]
    assert "copy.1" not in frames  # no stack frame: reported as "?"
    assert loop_profile.source_frames("HloModule m\nENTRY %main {\n}") == {}


def test_per_round_speedup_pairs_each_round_with_the_same_rounds_plain_run():
    # plain slows down in round 3 and so does the point: the per-round ratio stays 2
    med, q1, q3 = analysis.per_round_speedup([0.5, 0.5, 1.0, 0.5], [1.0, 1.0, 2.0, 1.0])
    assert (med, q1, q3) == (2.0, 2.0, 2.0)
    # a ratio of medians would read 1.0 / 0.5 = 2 here too; per round it is 1.5, 2, 3
    med, q1, q3 = analysis.per_round_speedup([1.0, 0.5, 0.5], [1.5, 1.0, 1.5])
    assert med == 2.0 and q1 == 1.75 and q3 == 2.5
    assert analysis.per_round_speedup([2.0], [1.0], token_ratio=2.0) == (1.0, 1.0, 1.0)
    with pytest.raises(ValueError, match="as many rounds"):
        analysis.per_round_speedup([1.0], [1.0, 1.0])


def test_quick_checks_flag_a_run_that_is_no_result():
    plain = {"name": "plain", "tokens": [[1, 2, 3]], "speedup": 1.0, "tau": 1.0}
    good = {"name": "mtp k=2", "tokens": [[1, 2, 3]], "speedup": 1.7, "tau": 2.4}
    assert analysis.quick_checks([plain, good], 0) == []  # the negative control
    fast = {**good, "speedup": 2.5}
    wrong = {**good, "name": "ngram k=2", "tokens": [[1, 2, 4]]}
    found = analysis.quick_checks([plain, fast, wrong], 3)
    assert found == [
        "3 compiles during the timed rounds",
        "mtp k=2: speed-up 2.50 above its tau 2.40",
        "ngram k=2: tokens differ from plain greedy",
    ]
