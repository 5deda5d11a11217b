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
