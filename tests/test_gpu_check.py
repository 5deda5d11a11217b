"""The prepared GPU check (experiments/gpu_check.py) runs end to end on CPU: its --cpu_smoke
configuration, in interpret mode, reports every method and passes its own correctness checks."""

from __future__ import annotations

from experiments import gpu_check


def test_gpu_check_cpu_smoke_runs_and_passes_its_checks():
    cfg = dict(
        methods=["recurrent", "assoc", "pallas"],  # "make gpu-check-smoke" times every method
        assoc_max_t=4,  # assoc is skipped (and marked) everywhere: it would only cost compile time
        budget_s=600.0,
        **gpu_check.SMOKE,
    )
    result = gpu_check.run_check(cfg)
    assert result["failures"] == []
    (prefill,) = result["prefill"]
    (window,) = result["windows"]
    assert prefill["ok"] and window["ok"] and result["bf16"]["ok"]
    assert prefill["assoc"] is None and window["assoc"] is None  # marked, not dropped
    for row in (prefill, window):
        assert all(isinstance(row[m], float) for m in ("recurrent", "pallas"))
    assert set(window["pallas_err"]) == {"o", "final", "u", "states"}
    assert [x["chunk"] for x in result["sweep"]] == [16]


def test_gpu_decode_cpu_smoke_checks_spec_against_greedy_and_times_the_roofline():
    from experiments import gpu_decode

    cfg = dict(cpu_smoke=True, parts=["large"], budget_s=600.0, json_out=None, **gpu_decode.SMOKE)
    result = gpu_decode.run(cfg)
    assert result["failures"] == []
    large = result["parts"]["large"]
    assert large["dtype"] == "bfloat16"
    rows = large["sweep"]["rows"]
    assert [r["point"] for r in rows] == ["plain greedy", "mtp k=2", "ngram k=3"]
    assert all(r["equals_plain"] for r in rows[1:])
    assert set(large["windows"]["chain_window_over_step"]) == {"1", "2", "3", "4"}
    assert large["roofline"]["step_weight_bytes"] > 0
    assert "default" not in result["parts"]


def test_gpu_decode_reports_the_first_mismatch():
    from experiments.gpu_decode import first_mismatch

    assert first_mismatch([[1, 2, 3], [4]], [[1, 2, 3], [4]]) is None
    assert first_mismatch([[1, 2, 3], [4, 5]], [[1, 2, 3], [4, 6]]) == [1, 1]
    assert first_mismatch([[1, 2]], [[1, 2, 3]]) == [0, 2]  # a shorter run differs too
