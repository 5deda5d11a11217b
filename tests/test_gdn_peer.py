"""Peer oracle: gated_delta_rule vs HF transformers' torch GDN; regenerate the fixture with
`.venv-hf/bin/python tests/fixtures/make_gdn_fixture.py` (needs the `hf` extra)."""

from pathlib import Path

import jax.numpy as jnp
import numpy as np
import pytest

from mtpspec.ops import gated_delta_rule

FIXTURE = Path(__file__).resolve().parent / "fixtures" / "gdn_peer.npz"
METHODS = ("recurrent", "chunk", "assoc")
HF_FORMS = ("recurrent", "chunk")  # HF's two torch implementations, both stored
RTOL = 1e-5
ATOL_REL = 1e-5  # atol = ATOL_REL * max|reference|


def _load():
    with np.load(FIXTURE) as z:
        data = {key: z[key] for key in z.files}
    cases = {}
    for key, val in data.items():
        case, name = key.split("/", 1)
        cases.setdefault(case, {})[name] = val
    return [cases[c] for c in sorted(cases, key=lambda c: int(c.removeprefix("case")))]


CASES = _load()
CASE_IDS = [str(c["name"]) for c in CASES]


def _run(case, method, beta=None, scale="stored"):
    o, state = gated_delta_rule(
        jnp.asarray(case["q"]),
        jnp.asarray(case["k"]),
        jnp.asarray(case["v"]),
        jnp.asarray(case["g"]),
        jnp.asarray(case["beta"] if beta is None else beta),
        initial_state=jnp.asarray(case["initial_state"]) if "initial_state" in case else None,
        scale=float(case["scale"]) if scale == "stored" else scale,
        method=method,
    )
    return np.asarray(o), np.asarray(state)


def _close(got, ref):
    return np.allclose(got, ref, rtol=RTOL, atol=ATOL_REL * np.abs(ref).max())


def _assert_close(got, ref, what):
    np.testing.assert_allclose(got, ref, rtol=RTOL, atol=ATOL_REL * np.abs(ref).max(), err_msg=what)


def test_fixture_is_well_formed():
    assert len(CASES) >= 4
    assert any("initial_state" not in c for c in CASES)
    assert any(c["q"].shape[2] != c["v"].shape[2] for c in CASES), "no GQA case"
    for c in CASES:
        b, t, hk, k = c["q"].shape
        hv, v = c["v"].shape[2:]
        assert c["o_recurrent"].shape == c["o_chunk"].shape == (b, t, hv, v)
        assert c["state_recurrent"].shape == c["state_chunk"].shape == (b, hv, k, v)
        assert np.isclose(c["scale"], k**-0.5)
        # HF's own two forms agree, so either is a fair reference
        assert _close(c["o_chunk"], c["o_recurrent"])
        assert _close(c["state_chunk"], c["state_recurrent"])


@pytest.mark.parametrize("method", METHODS)
@pytest.mark.parametrize("case", CASES, ids=CASE_IDS)
def test_matches_hf(case, method):
    o, state = _run(case, method)
    assert o.dtype == np.float32 and state.dtype == np.float32
    assert o.shape == case["o_recurrent"].shape
    assert state.shape == case["state_recurrent"].shape
    for form in HF_FORMS:
        _assert_close(o, case[f"o_{form}"], f"{method} o vs HF {form}")
        _assert_close(state, case[f"state_{form}"], f"{method} state vs HF {form}")


def test_default_scale_is_inverse_sqrt_k():
    case = CASES[0]
    o, state = _run(case, "recurrent", scale=None)
    _assert_close(o, case["o_recurrent"], "scale=None")
    _assert_close(state, case["state_recurrent"], "scale=None")


@pytest.mark.parametrize("method", METHODS)
def test_negative_control_perturbed_beta(method):
    """One perturbed beta entry must break the match, or the comparison proves nothing."""
    case = CASES[0]
    beta = case["beta"].copy()
    t = beta.shape[1] - 3  # late, so the decay has not yet washed it out of the final state
    beta[0, t, 1] += 0.1 if beta[0, t, 1] < 0.5 else -0.1  # stays in (0, 1)
    o, state = _run(case, method, beta=beta)
    assert not _close(o, case["o_recurrent"])
    assert not _close(state, case["state_recurrent"])
