"""The plain pip install builds the C++ kernels: ``pip wheel`` with build isolation (jax comes
from pyproject's ``[build-system] requires``), as ``pip install .`` / ``pip install -e .`` build,
and without a C++ compiler the build still succeeds and the first decoding call warns."""

from __future__ import annotations

import os
import pathlib
import shutil
import subprocess
import sys
import zipfile

import pytest

ROOT = pathlib.Path(__file__).resolve().parent.parent
# What the build reads: the package, its build files and README.md (setup.cfg's long description).
SOURCES = ["setup.py", "setup.cfg", "pyproject.toml", "README.md", "mtpspec"]


def _source_tree(dst: pathlib.Path) -> pathlib.Path:
    """A copy of the sources without built libraries, caches or the venv: the build runs there,
    not in the checkout the rest of the suite is importing."""
    dst.mkdir()
    for name in SOURCES:
        src = ROOT / name
        if src.is_dir():
            shutil.copytree(src, dst / name, ignore=shutil.ignore_patterns("*.so", "__pycache__"))
        else:
            shutil.copy2(src, dst / name)
    return dst


def _build_and_unpack(
    tmp_path: pathlib.Path, tag: str, env: dict, *pip_options: str
) -> tuple[list[str], pathlib.Path]:
    """``pip wheel`` the way users' pip builds (isolation on unless ``pip_options`` say
    otherwise), then the wheel's files unpacked into a directory of their own: (the wheel's
    member names, that directory)."""
    src = _source_tree(tmp_path / f"src-{tag}")
    wheels = tmp_path / f"wheels-{tag}"
    proc = subprocess.run(
        [sys.executable, "-m", "pip", "wheel", "--no-deps", "-q", *pip_options, "-w", str(wheels),
         str(src)],
        env=env, capture_output=True, text=True, timeout=900,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr[-3000:]
    (wheel,) = wheels.glob("mtpspec-*.whl")
    site = tmp_path / f"site-{tag}"
    with zipfile.ZipFile(wheel) as z:
        names = z.namelist()
        z.extractall(site)
    return names, site


def _run_from(site: pathlib.Path, *args: str) -> subprocess.CompletedProcess:
    """This venv's Python (its jax) importing mtpspec from ``site`` only (cwd outside the
    checkout; the editable install's path comes after PYTHONPATH)."""
    env = {**os.environ, "PYTHONPATH": str(site), "JAX_PLATFORMS": "cpu"}
    return subprocess.run(
        [sys.executable, *args], cwd=site, env=env, capture_output=True, text=True, timeout=300
    )


@pytest.mark.slow(120)
def test_a_plain_pip_build_compiles_the_kernels_and_without_a_compiler_still_installs(tmp_path):
    env = {**os.environ, "PIP_DISABLE_PIP_VERSION_CHECK": "1"}
    names, site = _build_and_unpack(tmp_path, "cxx", env)
    assert any(n.startswith("mtpspec/kernels/_cpu_kernels") and n.endswith(".so") for n in names)
    where = _run_from(site, "-c", "import mtpspec; print(mtpspec.__file__)")
    assert where.stdout.strip().startswith(str(site)), where.stdout + where.stderr
    status = _run_from(site, "-m", "mtpspec.kernels")
    assert status.returncode == 0, status.stdout + status.stderr
    assert status.stdout.startswith("library: built (_cpu_kernels"), status.stdout
    assert "mtpspec_cpu_linear: ok" in status.stdout

    # Without a compiler (this venv's jax and setuptools: the isolated environment is the first
    # build's point, not this one's).
    no_cxx = {**env, "CC": "/nonexistent/cc", "CXX": "/nonexistent/c++"}
    names, site = _build_and_unpack(tmp_path, "no-cxx", no_cxx, "--no-build-isolation")
    assert not any(n.endswith(".so") for n in names)
    status = _run_from(site, "-m", "mtpspec.kernels")
    assert status.returncode == 1 and "the C++ kernels are not built" in status.stdout
    first_use = (
        "import warnings; warnings.simplefilter('always')\n"
        "from mtpspec.models import inference\n"
        "for _ in range(2): inference.resolve_linear('auto', platform='cpu')\n"
    )
    warned = _run_from(site, "-c", first_use)
    assert warned.returncode == 0, warned.stderr[-2000:]
    assert warned.stderr.count("RuntimeWarning") == 1, warned.stderr  # once per process
    assert "C++ CPU kernels (linear, GDN window, attention) are unavailable" in warned.stderr
