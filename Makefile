# rtserve — two commands on a fresh clone:  make serve   |   make test
#
#   PYTHON=python3.11   interpreter used to create .venv
#   ORT=cpu|gpu         ONNX Runtime build: onnxruntime (default) or onnxruntime-gpu
#   PORT=8000           port for `make serve` (same as RTSERVE_PORT)

PYTHON ?= $(shell command -v python3.11 || command -v python3)
VENV   ?= .venv
ORT    ?= cpu
BIN    := $(VENV)/bin
STAMP  := $(VENV)/.rtserve-installed-$(ORT)
PORT   ?=

.PHONY: install serve test lint bench model-repository clean

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

# model_repository/ is a build output: exported from the committed weights/ when missing, or when it lacks the
# graphs of the configured backend (RTSERVE_BACKEND: onnx by default, torchscript; torch reads the checkpoints).
# The export writes only those graphs, and one line per model to stderr (its JSON lines, for scripts, are dropped).
model-repository: $(STAMP)
	@repository="$${RTSERVE_MODEL_REPOSITORY:-model_repository}"; \
	case "$${RTSERVE_BACKEND:-onnx}" in onnx) graph=onnx ;; torchscript) graph=ts ;; *) graph= ;; esac; \
	if ls weights/*/config.json >/dev/null 2>&1 && { [ ! -d "$$repository" ] || \
		{ [ -n "$$graph" ] && ! ls "$$repository"/*/*/*."$$graph" >/dev/null 2>&1; }; }; then \
		echo "exporting weights/ into $$repository/ for the $${RTSERVE_BACKEND:-onnx} backend (once)"; \
		$(BIN)/rtserve export --all weights --out "$$repository" >/dev/null; \
	fi

serve: $(STAMP) model-repository
	$(BIN)/rtserve serve $(if $(PORT),--port $(PORT))

# One benchmark run on this machine: docs/bench-<machine>.{json,md}; BENCH_ARGS="--quick" etc. pass through.
bench: $(STAMP) model-repository
	$(BIN)/rtserve bench $(BENCH_ARGS)

test: $(STAMP)
	$(BIN)/python -m pytest

lint: $(STAMP)
	$(BIN)/ruff check .

clean:
	rm -rf $(VENV) model_repository .pytest_cache .ruff_cache
