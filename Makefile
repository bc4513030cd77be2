# The two commands of the README, each doing its own set-up on a fresh machine:
#   make train   end-to-end RLVR of a tiny Qwen3 on the built-in task, GRPO vs HARA-tok, with a plot
#   make test    every check: package/notebook sync, all notebooks (nbdev_test), pytest
SHELL := /bin/bash
VENV ?= .venv
BIN := $(VENV)/bin
export HF_HUB_OFFLINE := 1
export TRANSFORMERS_OFFLINE := 1
export MPLBACKEND := Agg

.PHONY: install train test sync nbtest pytest
install:
	@bash tools/install.sh

train: install
	$(BIN)/hara-ref train

test: install
	PATH="$(abspath $(BIN)):$$PATH" bash tools/check_sync.sh
	# two notebooks at a time, one BLAS/OpenMP thread each: two 2-thread torch processes on 2 cores thrash
	OMP_NUM_THREADS=1 MKL_NUM_THREADS=1 PATH="$(abspath $(BIN)):$$PATH" $(BIN)/nbdev_test --n_workers 2 --timing
	$(BIN)/python -m pytest -q tests
