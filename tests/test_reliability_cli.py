"""A user's mistake on the command line ends in one line (the reliability catalogue, continued:
tests/test_reliability.py has the API-boundary cases, tests/test_reliability_process.py the
process-level ones).

Each case runs a real ``python -m experiments.<tool>`` in a subprocess, as a user would, with a
common mistake: a path that does not exist, an option this checkpoint does not support, a flag
value out of range or of the wrong type, a required flag left out. Each must end in exactly one
line ``experiments.<tool>: error: <message>`` on stderr and a non-zero status (2 for usage,
1 otherwise), with no traceback unless ``--debug`` asks for it (``experiments.cli.run``). The
mistakes are found before any model compiles, so each run costs about its imports.
"""

from __future__ import annotations

import json
import pathlib
import subprocess
import sys

import pytest

from tests.conftest import subprocess_env

ROOT = pathlib.Path(__file__).resolve().parent.parent
USAGE, FAILED = 2, 1


def run_tool(tool: str, *args, env=None, text=True, timeout=300) -> subprocess.CompletedProcess:
    """``python -m experiments.<tool> args...`` from the repository root, on the CPU."""
    return subprocess.run(
        [sys.executable, "-m", f"experiments.{tool}", *args],
        cwd=ROOT, env=env or subprocess_env(), capture_output=True, text=text, timeout=timeout,
    )  # fmt: skip


def error_lines(stderr: str) -> list[str]:
    return [line for line in stderr.splitlines() if line.strip()]


# (tool, arguments, exit status, words the one line must hold)
MISTAKES = {
    "generate: checkpoint does not exist": (
        "generate", ["--checkpoint=/nonexistent", "--prompt=x"], FAILED,
        ["/nonexistent", "does not exist"],
    ),
    # the shipped model (the default --checkpoint) has the byte tokenizer, without a chat template
    "generate: --chat without a chat template": (
        "generate", ["--chat", "--prompt=x"], FAILED, ["no chat template"],
    ),
    "generate: --max_new_tokens out of range": (
        "generate", ["--max_new_tokens=-1", "--prompt=x"], USAGE, ["--max_new_tokens", ">= 0"],
    ),
    "generate: --max_new_tokens not an integer": (
        "generate", ["--max_new_tokens=abc", "--prompt=x"], USAGE, ["--max_new_tokens", "abc"],
    ),
    "generate: unknown flag": (
        "generate", ["--prompt=x", "--no_such_flag"], USAGE, ["no_such_flag"],
    ),
    # an app.UsageError: absl printed the module docstring and every flag's help before it
    "generate: no prompt": ("generate", [], USAGE, ["--prompt", "--prompt_ids"]),
    "check_hf_export: required flag missing": (
        "check_hf_export", [], USAGE, ["--checkpoint", "required"],
    ),
    # checked before the load (the checkpoint does not exist either)
    "draft_vocab: --num_draft out of range": (
        "draft_vocab", ["--checkpoint=/nonexistent", "--size=8", "--num_draft=0"], USAGE,
        ["--num_draft", ">= 1"],
    ),
    "acceptance: checkpoint does not exist": (
        "acceptance", ["--checkpoint=/nonexistent"], FAILED, ["/nonexistent", "does not exist"],
    ),
}  # fmt: skip


@pytest.mark.parametrize("case", list(MISTAKES))
def test_a_command_line_mistake_ends_in_one_line(case):
    tool, args, status, words = MISTAKES[case]
    done = run_tool(tool, *args)
    lines = error_lines(done.stderr)
    assert done.returncode == status, done.stderr[-3000:]
    assert "Traceback" not in done.stderr
    assert len(lines) == 1, done.stderr[-3000:]
    assert lines[0].startswith(f"experiments.{tool}: error: "), lines[0]
    for word in words:
        assert word in lines[0]


def test_a_mistake_found_after_loading_a_checkpoint_is_still_one_line(tmp_path):
    """export_hf loads the checkpoint (orbax logs a dozen INFO lines while it does) before it
    finds the output directory taken; --debug shows those lines again (the negative control)."""
    (tmp_path / "taken").write_text("x")
    args = ["--checkpoint=mtpspec/assets/default_model", f"--out={tmp_path}"]
    done = run_tool("export_hf", *args)
    lines = error_lines(done.stderr)
    assert done.returncode == FAILED, done.stderr[-3000:]
    assert lines == [f"experiments.export_hf: error: {tmp_path} is not empty (taken, ...)"]
    loud = run_tool("export_hf", *args, "--debug")
    assert loud.returncode == FAILED
    assert "orbax" in loud.stderr and "Traceback" in loud.stderr


def test_debug_shows_the_traceback_before_the_line():
    done = run_tool("generate", "--checkpoint=/nonexistent", "--prompt=x", "--debug")
    lines = error_lines(done.stderr)
    assert done.returncode == FAILED, done.stderr[-3000:]
    assert lines[0] == "Traceback (most recent call last):"
    assert "checkpoints.load" in done.stderr  # the frames, down to where it was raised
    assert lines[-1] == (
        "experiments.generate: error: HF checkpoint directory /nonexistent does not exist"
    )


_SCRIPT = """
from experiments import cli

def main(argv):
    raise {"value": ValueError("first line\\n  second line"), "interrupt": KeyboardInterrupt(),
            "bug": RuntimeError("a bug")}[argv[1]]

cli.run(main)
"""


@pytest.mark.parametrize(
    "raised,status,line",
    [
        ("value", FAILED, "tool.py: error: first line; second line"),
        ("interrupt", 130, "tool.py: error: interrupted"),
        ("bug", FAILED, "RuntimeError: a bug"),  # not a user's mistake: the traceback stays
    ],
)
def test_the_runner_joins_lines_reports_ctrl_c_and_keeps_a_bugs_traceback(
    tmp_path, raised, status, line
):
    script = tmp_path / "tool.py"
    script.write_text(_SCRIPT)
    env = {**subprocess_env(), "PYTHONPATH": str(ROOT)}
    done = subprocess.run(
        [sys.executable, str(script), raised], cwd=ROOT, env=env, capture_output=True, text=True,
        timeout=120,
    )  # fmt: skip
    lines = error_lines(done.stderr)
    assert done.returncode == status, done.stderr[-3000:]
    assert lines[-1] == line
    assert ("Traceback" in done.stderr) == (raised == "bug")
    if raised != "bug":
        assert len(lines) == 1, done.stderr[-3000:]


def test_non_utf8_argv_bytes_reach_the_byte_tokenizer_through_the_cli(tmp_path):
    """``--prompt=`` bytes that are not UTF-8 reach the model as exactly those bytes and are echoed
    back as those bytes. tests/test_reliability.py's older case missed the echo's
    UnicodeEncodeError: it inherits this machine's C.UTF-8 locale, where Python's stdout writes
    surrogate escapes back as bytes; a user's UTF-8 locale (here PYTHONIOENCODING=utf-8) has a
    strict stdout. It also checked only the number of tokens, not which prompt ids arrived."""
    prompt = b"caf\xe9 \xff\xfe"
    out = tmp_path / "out.json"
    env = {**subprocess_env(), "PYTHONIOENCODING": "utf-8"}
    done = run_tool(
        "generate", b"--prompt=" + prompt, "--max_new_tokens=2", f"--json_out={out}",
        env=env, text=False,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr[-3000:].decode(errors="replace")
    got = json.loads(out.read_text())
    assert got["prompt_ids"] == list(prompt)  # what generate passed to the decoder
    assert len(got["tokens"]) == 2
    assert done.stdout.startswith(prompt)  # the echo: the user's own bytes


def test_the_demo_prints_its_table_with_iqr_and_a_verdict():
    done = run_tool("generate", "--demo", "--num_draft=2", "--rounds=2", "--max_new_tokens=24")
    assert done.returncode == 0, done.stderr[-3000:]
    out = done.stdout
    rows = [line for line in out.splitlines() if line.startswith(("plain greedy", "mtp k=2"))]
    assert len(rows) == 2 and rows[0].split()[-1] == "True" and rows[1].split()[-1] == "True"
    assert "(" in rows[1] and "-" in rows[1]  # the IQR column
    assert "other processes and steal during the rounds" in out
    verdict = [line for line in out.splitlines() if line.startswith(("best:", "INVALID RUN"))]
    assert len(verdict) == 1, out[-2000:]
