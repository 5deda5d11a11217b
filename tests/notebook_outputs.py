"""Notebooks are stored with their outputs, stamped with the code that made them.

    python -m tests.notebook_outputs            # execute every notebook in place (make notebooks)
    python -m tests.notebook_outputs notebooks/02_acceptance_analysis.ipynb

Executing a notebook here writes its outputs (figures included: the inline backend), and its
metadata ``mtpspec.code_sha256``, the hash of its code cells. ``tests/test_notebooks.py`` checks
that the stored outputs are present, error-free and stamped with the current cells, executes the
notebook afresh and compares the lines its metadata ``mtpspec.key_lines`` names (regular
expressions; figures that do not depend on timing) against the stored ones: the same words and
integers, the decimal numbers within ``RTOL`` / ``ATOL`` (XLA's code differs a little between CPUs).
"""

from __future__ import annotations

import hashlib
import json
import math
import pathlib
import re
import sys

NUMBER = re.compile(r"[-+]?(?:\d+\.\d*|\.\d+|\d+)(?:[eE][-+]?\d+)?")
RTOL, ATOL = 0.05, 0.02
ROOT = pathlib.Path(__file__).resolve().parent.parent


def code_sha256(nb) -> str:
    cells = [c.source for c in nb.cells if c.cell_type == "code"]
    return hashlib.sha256(json.dumps(cells).encode()).hexdigest()


def key_lines(nb) -> list[str]:
    """The lines of the notebook's stream outputs that match its ``mtpspec.key_lines``."""
    patterns = [re.compile(p) for p in nb.metadata.get("mtpspec", {}).get("key_lines", [])]
    lines = [
        line
        for cell in nb.cells
        if cell.cell_type == "code"
        for out in cell.get("outputs", [])
        if out.get("output_type") == "stream"
        for line in "".join(out.get("text", "")).splitlines()
    ]
    return [line for line in lines if any(p.search(line) for p in patterns)]


def _is_int(text: str) -> bool:
    return not any(c in text for c in ".eE")


def differences(stored: list[str], fresh: list[str]) -> list[str]:
    """Where two runs' key lines differ: another line count, other words, another integer, or a
    decimal number outside RTOL / ATOL. Empty when they agree."""
    if len(stored) != len(fresh):
        return [f"{len(stored)} key lines stored, {len(fresh)} in this run: {stored} / {fresh}"]
    out = []
    for a, b in zip(stored, fresh, strict=True):
        if NUMBER.sub("#", a) != NUMBER.sub("#", b):
            out.append(f"stored {a!r}, now {b!r}")
            continue
        for x, y in zip(NUMBER.findall(a), NUMBER.findall(b), strict=True):
            if _is_int(x) and _is_int(y):  # ids, counts, shapes: exactly
                if int(x) != int(y):
                    out.append(f"stored {a!r}, now {b!r} ({x} vs {y})")
                    break
            elif not math.isclose(float(x), float(y), rel_tol=RTOL, abs_tol=ATOL):
                out.append(f"stored {a!r}, now {b!r} ({x} vs {y})")
                break
    return out


def execute(path: pathlib.Path, **client_options) -> None:
    """Run ``path`` top to bottom in a fresh kernel (working directory: its folder), keep the
    outputs, stamp it and write it back."""
    import nbclient
    import nbformat

    nb = nbformat.read(path, as_version=4)
    resources = {"metadata": {"path": str(path.parent)}}
    nbclient.NotebookClient(
        nb, timeout=900, kernel_name="python3", resources=resources, **client_options
    ).execute()
    meta = nb.metadata.setdefault("mtpspec", {})
    meta["outputs_committed"] = True
    meta["code_sha256"] = code_sha256(nb)
    nbformat.write(nb, path)


def main(argv: list[str]) -> int:
    paths = [pathlib.Path(a) for a in argv] or sorted((ROOT / "notebooks").glob("*.ipynb"))
    for path in paths:
        execute(path)
        print(f"{path}: executed, outputs stored and stamped")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
