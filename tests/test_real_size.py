"""The real-size tools on a reduced shape with the real 248,320-token vocabulary: the fixture
writer (the released Qwen3.5 layout, HF init scales) reads back bit for bit, the bench runs end to
end with its exactness checks, and the draft-vocabulary tool keeps plain greedy's tokens."""

from __future__ import annotations

import json
import subprocess
import sys

import jax
import numpy as np
import pytest

from experiments import make_real_size
from mtpspec import checkpoints
from mtpspec.decoding.draft_vocab import DraftVocab
from tests.conftest import subprocess_env

ROOT = __import__("pathlib").Path(__file__).resolve().parent.parent


@pytest.fixture(scope="module")
def reduced(tmp_path_factory):
    cfg = make_real_size.real_size_config(hidden=64, layers=4)
    params = make_real_size.random_params(cfg, seed=0)
    out = tmp_path_factory.mktemp("real") / "q35"
    checkpoints.save_hf(cfg, params, out, layout="conditional_generation", max_shard_bytes=20 << 20)
    return cfg, params, out


def test_fixture_is_the_released_layout_at_hf_scales_and_reads_back(reduced):
    cfg, params, out = reduced
    assert cfg.vocab_size == 248_320 and cfg.tie_word_embeddings and cfg.dtype == "bfloat16"
    top = json.loads((out / "config.json").read_text())
    assert top["architectures"] == ["Qwen3_5ForConditionalGeneration"] and "text_config" in top
    assert (out / "model.safetensors.index.json").is_file()
    got_cfg, got = checkpoints.load_hf(out)
    assert got_cfg == cfg
    same = jax.tree.map(lambda a, b: np.array_equal(np.asarray(a), np.asarray(b)), got, params)
    assert all(jax.tree.leaves(same))
    embed = np.asarray(params["embed"], np.float32)
    assert abs(embed.std() - 0.02) < 1e-3  # HF's initializer_range
    assert not np.asarray(params["final_norm"], np.float32).any()  # (1 + w) norms: zero
    gdn = params["layers"][0]["gdn"]
    assert np.all(np.asarray(gdn["norm"], np.float32) == 1)
    assert np.all(np.exp(np.asarray(gdn["A_log"], np.float32)) <= 16.0)
    with pytest.raises(ValueError, match="multiple of 4"):
        make_real_size.real_size_config(layers=6)


def _tool(*args, timeout=600) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", *args], cwd=ROOT, env=subprocess_env(), capture_output=True,
        text=True, timeout=timeout, check=False,
    )  # fmt: skip


@pytest.mark.slow(60)
def test_bench_runs_end_to_end_with_its_exactness_checks(reduced, tmp_path):
    _, _, out = reduced
    js = tmp_path / "bench.json"
    # a stand-in llama-bench: its JSON rows as the real one writes them, each call logged, so the
    # test sees one call per round and the ratios taken against that round's figures
    calls = tmp_path / "calls"
    peer = tmp_path / "llama-bench"
    peer.write_text(
        f"#!{sys.executable}\n"
        "import json, os, sys\n"
        f"log = {str(calls)!r}\n"
        "n = sum(1 for _ in open(log)) if os.path.exists(log) else 0  # calls before this one\n"
        "open(log, 'a').write(' '.join(sys.argv[1:]) + '\\n')\n"
        "print(json.dumps([{'n_prompt': 48, 'n_gen': 0, 'avg_ts': 100.0 * (n + 1)},\n"
        "                  {'n_prompt': 0, 'n_gen': 6, 'avg_ts': 10.0 * (n + 1)}]))\n"
    )
    peer.chmod(0o755)
    gguf = tmp_path / "m.gguf"
    gguf.write_bytes(b"GGUF")
    done = _tool(
        "experiments.bench_real_size", f"--checkpoint={out}", "--dtype=float32",
        "--prompt_len=48", "--new_tokens=6", "--repeats=2", "--num_draft=1",
        "--draft_vocab=4096", f"--json_out={js}", f"--llama_bench={peer}", f"--gguf={gguf}",
    )  # fmt: skip
    assert done.returncode == 0, done.stderr[-2000:]
    got = json.loads(js.read_text())
    assert got["recompiles_while_timed"] == 0
    assert got["kernels"]["prefill_activations"] == "float32"  # the settings it ran with
    assert set(got["configs"]) == {"mtp k=1", "mtp k=1 vocab=4096"}
    assert all(c["same_as_plain"] for c in got["configs"].values())
    assert got["decode_tok_s"]["median"] > 0 and got["rss_peak_gib"] >= got["rss_after_load_gib"]
    logged = calls.read_text().splitlines()
    assert len(logged) == 2 and all(f"-m {gguf} -t 2 -p 48 -n 6 -r 1" in c for c in logged)
    assert got["llama_cpp"]["pp48"]["per_round"] == [100.0, 200.0]
    assert got["llama_cpp"]["tg6"]["per_round"] == [10.0, 20.0]
    # each round's ratio is against that round's peer (10, then 20 tok/s): undone, the two
    # rounds' own decode figures, whose median the bench reports
    ratios = got["vs_llama_cpp"]["decode"]["per_round"]
    ours = [ratios[0] * 10, ratios[1] * 20]
    assert np.mean(ours) == pytest.approx(got["decode_tok_s"]["median"], rel=1e-9)
    ratios = got["vs_llama_cpp"]["prefill"]["per_round"]
    ours = [ratios[0] * 100, ratios[1] * 200]  # the prompt over the median time:
    assert 2 / (1 / ours[0] + 1 / ours[1]) == pytest.approx(got["prefill_tok_s"], rel=1e-9)
    bad = _tool("experiments.bench_real_size", f"--checkpoint={out}", "--draft_vocab=300000")
    assert bad.returncode == 1 and "must lie in 1..248320" in bad.stderr.strip().splitlines()[-1]
    # the peer's flags are checked before the load: one line each
    alone = _tool("experiments.bench_real_size", f"--checkpoint={out}", f"--llama_bench={peer}")
    last = alone.stderr.strip().splitlines()[-1]
    assert alone.returncode == 1 and "--llama_bench and --gguf go together" in last, last
    # the rest of check_peer in one process (the bench's flags stay out of this one's registry)
    checks = f"""
import os, pytest
from experiments.bench_real_size import check_peer
with pytest.raises(OSError, match="none.gguf: no such file"):
    check_peer({str(peer)!r}, {str(tmp_path / "none.gguf")!r})
with pytest.raises(OSError, match="no such executable"):  # a file, but not executable
    check_peer({str(gguf)!r}, {str(gguf)!r})
with pytest.raises(OSError, match="no such executable"):  # a name not on PATH
    check_peer("llama-bench-absent-mtpspec-test", {str(gguf)!r})
os.environ["PATH"] = {str(tmp_path)!r} + os.pathsep + os.environ["PATH"]
assert check_peer("llama-bench", {str(gguf)!r}) == {str(peer)!r}  # found on PATH
"""
    done = subprocess.run(
        [sys.executable, "-c", checks], cwd=ROOT, env=subprocess_env(), capture_output=True,
        text=True, timeout=300, check=False,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr[-2000:]


@pytest.mark.slow(40)
def test_draft_vocab_tool_counts_the_training_split_and_keeps_greedy(tmp_path):
    done = _tool(
        "experiments.draft_vocab", "--size=48", f"--out={tmp_path}", "--measure",
        "--max_new_tokens=24", "--num_draft=2",
    )  # fmt: skip
    assert done.returncode == 0, done.stderr[-2000:]
    got = json.loads(done.stdout)
    vocab = DraftVocab.load(tmp_path)
    assert vocab.size == 48 and "training split" in vocab.source
    assert ord(" ") in vocab.ids and ord("e") in vocab.ids  # the commonest bytes of code
    assert 0.5 < got["coverage"] < 1.0
    assert set(got["runs"]) == {"mtp k=2 full", "mtp k=2 vocab=48"}  # --num_draft=2 alone
    assert all(r["same_as_plain"] for r in got["runs"].values())
    assert got["runs"]["mtp k=2 vocab=48"]["tau"] > 1.2
