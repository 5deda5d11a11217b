# `make test` sets up everything itself: a .venv, an editable install with the dev extra,
# then a lint + format check over every module, then the whole pytest suite. `make demo` needs
# only the package: it installs without the dev extra (~100 s instead of ~170 s on a fresh clone).
PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed
BASE_STAMP := $(VENV)/.installed-base
SOURCES := setup.cfg setup.py pyproject.toml $(wildcard mtpspec/kernels/*.cc) $(wildcard mtpspec/kernels/*.h)

.PHONY: test test-default-opt test-hf lint format install demo bench-gdn gpu-check-smoke gpu-run-smoke clean notebooks

$(BIN)/python:
	$(PYTHON) -m venv $(VENV)

# The C++ CPU kernels (mtpspec/kernels/*.cc) compile against jaxlib's XLA FFI headers, so jax goes
# in first and the package builds without isolation. Without a C++ compiler the install still
# succeeds and the kernels are reported unavailable (mtpspec.kernels.library.status()).
# The dev install is a superset of the base one, so it stamps both.
# $(call pip_install,EXTRA): the venv's tools, then jax, then the package with EXTRA ('' or [dev]).
define pip_install
	$(BIN)/python -m pip install -q --upgrade pip 'setuptools>=68' wheel
	$(BIN)/python -m pip install -q 'jax>=0.7.2'
	$(BIN)/python -m pip install -q --no-build-isolation -e '.$(1)'
endef

$(STAMP): $(BIN)/python $(SOURCES)
	$(call pip_install,[dev])
	touch $(BASE_STAMP) $(STAMP)

$(BASE_STAMP): $(BIN)/python $(SOURCES)
	$(call pip_install,)
	touch $(BASE_STAMP)

install: $(STAMP)

lint: $(STAMP)
	$(BIN)/ruff check mtpspec experiments tests
	$(BIN)/ruff format --check mtpspec experiments tests

format: $(STAMP)
	$(BIN)/ruff check --fix mtpspec experiments tests
	$(BIN)/ruff format mtpspec experiments tests

# The suite shares a persistent XLA compilation cache (.jax_cache/) between its xdist workers and
# subprocesses; `make test MTPSPEC_TEST_JAX_CACHE=off` runs without it. Optimisation levels
# (tests/conftest.py): every decoding program in the suite's own processes compiles at XLA's
# default level (the code users run: the spec == greedy, commit and kernel oracles hold for it);
# the oracles' own jits and the subprocesses run at LLVM -O0.
# `--maxschedchunk 2`: workers take tests two at a time, so the long ones that tests/conftest.py
# puts first spread over both workers. No crash reruns: a crash fails the run.
test: lint
	$(BIN)/python -m pytest -n 2 --maxschedchunk 2 -q tests

# Optional: the whole suite at XLA's default level, the oracles' own programs and the subprocesses
# (notebooks, CLIs, the 8-device suite) included (~1.7x `make test`'s time).
test-default-opt: $(STAMP)
	XLA_FLAGS="--xla_backend_optimization_level=3" $(BIN)/python -m pytest -n 2 --maxschedchunk 2 -q tests

# Optional: the transformers side of the HF export (tests/hf, skipped by `make test`). Its own venv
# with the hf extra; torch is pinned to the 2.13.0 CPU wheel this machine keeps on local disk
# (the registry's default torch wheel pulls CUDA libraries and triton, which must not be installed).
HF_VENV := .venv-hf-test
HF_STAMP := $(HF_VENV)/.installed

$(HF_STAMP): setup.cfg pyproject.toml
	$(PYTHON) -m venv $(HF_VENV)
	$(HF_VENV)/bin/python -m pip install -q --upgrade pip 'setuptools>=68' wheel
	$(HF_VENV)/bin/python -m pip install -q 'torch==2.13.0' 'jax>=0.7.2'
	$(HF_VENV)/bin/python -m pip install -q --no-build-isolation -e '.[dev,hf]'
	touch $(HF_STAMP)

test-hf: $(HF_STAMP)
	$(HF_VENV)/bin/python -m pytest -q tests/hf

demo: $(BASE_STAMP)
	$(BIN)/python -m experiments.generate --demo --num_draft=1,2,3,4

bench-gdn: $(BASE_STAMP)
	$(BIN)/python -m experiments.bench_gdn

# The prepared GPU check on CPU: interpret mode, tiny shapes, < 1 minute.
gpu-check-smoke: $(STAMP)
	PYTHON=$(BIN)/python experiments/gpu_check.sh --cpu_smoke

# The whole prepared GPU run on CPU: gpu_check and gpu_decode, tiny shapes, ~2 minutes.
gpu-run-smoke: $(STAMP)
	PYTHON=$(BIN)/python OUT=/tmp/gpu_run experiments/gpu_run.sh --cpu_smoke

clean:
	rm -rf $(VENV) $(HF_VENV) build *.egg-info .pytest_cache .jax_cache mtpspec/kernels/_cpu_*.so

# Re-execute the notebooks in place, storing their outputs (figures inline) stamped with their
# code cells' hash (tests/notebook_outputs.py; make test checks the stamp and the key figures).
notebooks: $(STAMP)
	env -u MPLBACKEND JAX_PLATFORMS=cpu $(BIN)/python -m tests.notebook_outputs
