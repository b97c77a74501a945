# gnnpipe — `make pipeline` sets everything up on a fresh machine and runs the pipeline; `make test` runs the tests.
SHELL := /bin/bash
PYTHON ?= python3
VENV ?= .venv
TORCH_VERSION ?= 2.13.0
ARTIFACTS ?= ./artifacts
PREFECT_HOME ?= $(CURDIR)/.prefect
STAGE ?=
ARGS ?=
PYTEST_ARGS ?=
# The suite waits more than it computes (process and server start-ups, ranks' rendezvous, timeouts): 2407 CPU-s in
# 1893 s of wall time on 2 cores (126 %, one process), so it runs in TEST_WORKERS pytest-xdist processes, a test file
# per process at a time (module fixtures built once). TEST_WORKERS=0: one process, as before. Not 3 on 2 cores:
# 11 training/infer/flow files took 412 s with 2 (192 % CPU) and 505 s with 3 (196 %; 27 % more CPU-s in contention).
TEST_WORKERS ?= 2

PREFECT_PORT ?= 4200
DEPLOYMENT ?= gnnpipe/default

export PREFECT_HOME
export PREFECT_PORT
export PREFECT_SERVER_ANALYTICS_ENABLED ?= false
export ARTIFACTS
export PYTHONUNBUFFERED = 1

BIN := $(VENV)/bin
STAMP := $(VENV)/.installed-$(TORCH_VERSION)

.PHONY: help venv pipeline stage train status test lint params clean clean-venv bench bench-peer server-up server-down deploy \
	gpu-check gpu-wheels \
	worker-up worker-down run-deployment

help:
	@echo "make pipeline            set up .venv if needed, run download → partition → features → hotness → train"
	@echo "make stage STAGE=name    rerun one stage, upstream taken from the cache"
	@echo "make train ARGS='--nnodes 2 --node-rank 0 --rdzv HOST:29400'   this machine's share of a multi-node job"
	@echo "make status              each stage's key, cache state and summary"
	@echo "make test                run the test suite"
	@echo "make lint                ruff (style, import order) and mypy (types, the stage protocol)"
	@echo "make params              every parameter: names, stage, default, meaning"
	@echo "make gpu-check GPU_OUT=dir   CUDA tests + GPU benchmarks (needs .whl/ from make gpu-wheels); no GPU: skips"
	@echo "make clean               delete $(ARTIFACTS) and the Prefect cache records"
	@echo "make server-up deploy worker-up run-deployment ARGS='-p num_partitions=4'   run through a Prefect deployment"
	@echo "make worker-down server-down                                              stop them (by PID)"
	@echo "variables: ARTIFACTS=$(ARTIFACTS) TORCH_VERSION=$(TORCH_VERSION) PREFECT_HOME=$(PREFECT_HOME) ARGS='--set k=v ...'"

venv: $(STAMP)

# torch first, pinned: an unpinned torch would pull several GB of CUDA wheels. uv applies overrides.txt.
$(STAMP): pyproject.toml overrides.txt
	test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install -q --upgrade pip uv
	$(BIN)/python -m pip install -q torch==$(TORCH_VERSION)
	$(BIN)/uv pip install -q --compile-bytecode --python $(BIN)/python --override overrides.txt "torch==$(TORCH_VERSION)" -e ".[dev]"
	touch $@

pipeline: $(STAMP)
	$(BIN)/gnnpipe run --artifacts $(ARTIFACTS) $(ARGS)

stage: $(STAMP)
	@test -n "$(STAGE)" || { echo "usage: make stage STAGE=<download|partition|features|hotness|train>"; exit 2; }
	$(BIN)/gnnpipe stage $(STAGE) --artifacts $(ARTIFACTS) $(ARGS)

train: $(STAMP)
	$(BIN)/gnnpipe train --artifacts $(ARTIFACTS) $(ARGS)

status: $(STAMP)
	$(BIN)/gnnpipe status --artifacts $(ARTIFACTS) $(ARGS)

test: $(STAMP)
	$(BIN)/python -m pytest $(if $(filter 0,$(TEST_WORKERS)),,-n $(TEST_WORKERS) --dist loadfile) $(PYTEST_ARGS)

lint: $(STAMP)
	$(BIN)/ruff check .
	$(BIN)/mypy

params: $(STAMP)
	$(BIN)/gnnpipe params

# Products-scale benchmarks (minutes each; figures recorded in benchmarks/RESULTS.md).
BENCH_GRAPH ?= benchmarks/work/products_pipeline.npz
# Deployments: a local server, a process worker, and `prefect deployment run` against them.
server-up: $(STAMP)
	$(BIN)/gnnpipe server up --port $(PREFECT_PORT)

server-down:
	@if test -x $(BIN)/gnnpipe; then $(BIN)/gnnpipe server down; fi

deploy: $(STAMP)
	$(BIN)/gnnpipe deploy --port $(PREFECT_PORT)

worker-up: $(STAMP)
	$(BIN)/gnnpipe worker up --port $(PREFECT_PORT)

worker-down:
	@if test -x $(BIN)/gnnpipe; then $(BIN)/gnnpipe worker down; fi

run-deployment: $(STAMP)
	PREFECT_API_URL=http://127.0.0.1:$(PREFECT_PORT)/api $(BIN)/prefect deployment run '$(DEPLOYMENT)' $(ARGS) --watch

# GPU validation (issue [7/7]): CUDA tests + GPU benchmarks into GPU_OUT; on a machine without a GPU it says so and
# exits 0. It needs no venv and no network: a GPU machine's python3 has torch, and what it lacks comes from .whl/
# (`make gpu-wheels`, run beforehand where pip reaches an index).
GPU_OUT ?= benchmarks/work/gpu-check
GPU_ARGS ?=
GPU_PYTHON ?= $(if $(wildcard $(BIN)/python),$(BIN)/python,python3)

gpu-check:
	$(GPU_PYTHON) benchmarks/gpu_check.py --out $(GPU_OUT) $(GPU_ARGS)

gpu-wheels: $(STAMP)
	$(BIN)/python benchmarks/gpu_check.py --download-wheels

bench: $(STAMP)
	$(BIN)/python benchmarks/bench_pipeline.py --parts 2,4
	$(BIN)/python benchmarks/bench_hotness.py --parts 2 --png benchmarks/hotness_curve.png
	$(BIN)/python benchmarks/bench_sampler.py --nodes 2400000 --avg-degree 50 --graph $(BENCH_GRAPH) --batches 30 --threads 2
	$(BIN)/python benchmarks/bench_sampler.py --graph $(BENCH_GRAPH) --mode dist --threads 2 --batches 30

# Optional peer: PyG's NeighborLoader needs torch-sparse/torch-scatter, which only build from source (~20 min).
bench-peer: $(STAMP)
	$(BIN)/python -m pip install --no-build-isolation torch-scatter torch-sparse
	$(BIN)/python benchmarks/bench_peer_pyg.py --graph $(BENCH_GRAPH) --batches 30 --threads 2

clean:
	@if test -x $(BIN)/gnnpipe; then $(BIN)/gnnpipe clean --artifacts $(ARTIFACTS); else rm -rf $(ARTIFACTS); fi

clean-venv:
	rm -rf $(VENV)
