# rtserve — two commands on a fresh clone:  make serve   |   make test
#
#   PYTHON=python3.11   interpreter used to create .venv
#   ORT=cpu|gpu         ONNX Runtime build: onnxruntime (default) or onnxruntime-gpu
#   PORT=8000           port for `make serve` (same as RTSERVE_PORT)
#   PEERS=.venv-peers   the Triton peer's venv for `rtserve bench --only triton` (`make peers`)

PYTHON ?= $(shell command -v python3.11 || command -v python3)
VENV   ?= .venv
ORT    ?= cpu
BIN    := $(VENV)/bin
STAMP  := $(VENV)/.rtserve-installed-$(ORT)
PORT   ?=
PEERS  ?= .venv-peers
PEERS_STAMP := $(PEERS)/.rtserve-peers-installed

.PHONY: install serve test lint bench peers model-repository gpu-carry gpu-check clean

# Create the venv if missing and install rtserve (editable) with one ONNX Runtime build.
$(STAMP): pyproject.toml
	@test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet --upgrade pip
	@# the two ONNX Runtime builds cannot share one environment
	@if ls $(VENV)/.rtserve-installed-* >/dev/null 2>&1; then $(BIN)/python -m pip uninstall --quiet -y onnxruntime onnxruntime-gpu; fi
	$(BIN)/python -m pip install --quiet -e ".[$(ORT),dev]"
	@rm -f $(VENV)/.rtserve-installed-*
	@touch $@

install: $(STAMP)

# model_repository/ is a build output: exported from the committed weights/ for each model's serving backend
# (RTSERVE_MODEL_BACKENDS, else RTSERVE_BACKEND: onnx by default, torchscript; torch reads the checkpoint). An entry
# that lacks the graphs its backend loads is exported again; the others are left as they are. Progress: one line
# per model exported, on stderr (its JSON lines, for scripts, are dropped).
model-repository: $(STAMP)
	@if ls weights/*/config.json >/dev/null 2>&1; then \
		$(BIN)/rtserve export --all weights --out "$${RTSERVE_MODEL_REPOSITORY:-model_repository}" --missing >/dev/null; \
	fi

serve: $(STAMP) model-repository
	$(BIN)/rtserve serve $(if $(PORT),--port $(PORT))

# One benchmark run on this machine: bench-results/bench-<machine>.{json,md}; BENCH_ARGS="--quick" etc. pass through.
bench: $(STAMP) model-repository
	$(BIN)/rtserve bench $(BENCH_ARGS)

# The Triton peer of `rtserve bench --only triton`: Triton 2.51's CPU tritonserver and python backend from
# nvidia-pytriton 0.7.0, tritonclient 2.50.0 (its wheel ships perf_analyzer), ONNX Runtime, safetensors and
# tokenizers, in a venv of their own: nvidia-pytriton and tritonclient 2.50 need numpy<2, rtserve pins numpy 2.
# The python backend's stub for this Python goes beside libtriton_python.so, as pytriton does before a start.
$(PEERS_STAMP): Makefile
	@test -x $(PEERS)/bin/python || $(PYTHON) -m venv $(PEERS)
	$(PEERS)/bin/python -m pip install --quiet --upgrade pip
	$(PEERS)/bin/python -m pip install --quiet nvidia-pytriton==0.7.0 "tritonclient[grpc,http]==2.50.0" \
		onnxruntime==1.31.1 safetensors==0.8.0 tokenizers==0.23.3 "numpy<2"
	@site="$$($(PEERS)/bin/python -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')"; \
	version="$$($(PEERS)/bin/python -c 'import sys; print("%d.%d" % sys.version_info[:2])')"; \
	cp "$$site/pytriton/tritonserver/python_backend_stubs/$$version/triton_python_backend_stub" \
		"$$site/pytriton/tritonserver/backends/python/"
	@touch $@

peers: $(PEERS_STAMP)

# The GPU run (benchmarks/gpu_run.sh): gpu-carry/ is what it carries to a host without a package index (within what the
# tree leaves of 64 MiB: the models as the torch backend reads them, the bench's data, the cp312 wheels the host may
# lack); gpu-check runs it on this machine's GPU, or with GPU_ARGS="--device cpu --quick" rehearses it here. The report
# goes to $$OUT/docs/bench-h200/.
gpu-carry: $(STAMP) model-repository
	$(BIN)/python benchmarks/gpu_carry.py

gpu-check:
	bash benchmarks/gpu_run.sh $(GPU_ARGS)

test: $(STAMP)
	$(BIN)/python -m pytest

lint: $(STAMP)
	$(BIN)/ruff check .

clean:
	rm -rf $(VENV) $(PEERS) model_repository .pytest_cache .ruff_cache
