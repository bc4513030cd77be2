# The two commands of the README, each doing its own set-up on a fresh machine:
#   make train   end-to-end RLVR of a tiny Qwen3 on the built-in countdown task, GRPO vs HARA-tok, 5 seeds, with a plot
#   make test    every check: package/notebook sync, ruff, all notebooks (nbdev_test), pytest
# and for readers:
#   make docs        run every notebook and render it, figures and math included, into the static site _docs/
#   make pages       run the core chapters (nbs/core_path.txt), their outputs written into the notebooks,
#                    to commit: GitHub and Jupyter show their figures and numbers without a build
#   make docs-check  the committed outputs current and clean (tools/pages.py check), then every page of
#                    _docs/ in headless Chromium: screenshots, fails on JS errors, broken images,
#                    untypeset math or error output (Debian: apt-get install chromium)
SHELL := /bin/bash
VENV ?= .venv
BIN := $(VENV)/bin
export HF_HUB_OFFLINE := 1
export TRANSFORMERS_OFFLINE := 1
export MPLBACKEND := Agg

# the numerical notebooks: OT, HARA and float32 comparisons (tolerances from `rounding_tol`, 43_verifier_engine)
NUM_NBS := 02_rlvr|05_sinkhorn|06_fgw|07_fgw_barycenter|08_linearization|11_rollouts|12_novelty|13_hara|15_policy|26_trl|31_sinkhorn_batched|32_newton|33_bary_steps|34_barycenters|41_novelty_engine|50_hp_rlvr|42_hara_engine|38_checks|43_verifier_engine|36_ot_checks|hara_math

.PHONY: install train test sync nbtest pytest pages docs docs-check
install:
	@bash tools/install.sh

train: install
	$(BIN)/hara-ref train --task countdown --seeds 5 --eval-samples 16

test: install
	PATH="$(abspath $(BIN)):$$PATH" bash tools/check_sync.sh
	# the core chapters' committed outputs come from the committed code and are clean (nothing is run)
	$(BIN)/python tools/pages.py check --strict
	# code reads on the rendered page: lines of at most 100 characters, one statement per line
	$(BIN)/ruff check nbs hara_ref tests tools examples
	$(BIN)/ruff format --check nbs tests tools examples
	# two notebooks at a time, one BLAS/OpenMP thread each: two 2-thread torch processes on 2 cores thrash
	OMP_NUM_THREADS=1 MKL_NUM_THREADS=1 PATH="$(abspath $(BIN)):$$PATH" $(BIN)/nbdev_test --n_workers 2 --timing
	# two test processes, one BLAS/OpenMP thread each (as the notebooks)
	OMP_NUM_THREADS=1 MKL_NUM_THREADS=1 $(BIN)/python -m pytest -q -n 2 tests
	# answers must not depend on the CPU: the numerical notebooks and tests (marked `numerical` or
	# `float32`, tests/conftest.py) once more on other kernels. ATen's portable set (another summation
	# order than AVX2/AVX-512) together with MKL's portable path (MKL_CBWR=COMPATIBLE, the path AMD CPUs
	# take), then each other MKL path this CPU runs (AVX2 on Intel); tools/mkl_paths.py asks MKL which
	# paths it really takes here and prints them
	while read -r kernels; do \
	  [ -n "$$kernels" ] || continue; echo "numerical checks again on $$kernels"; \
	  env $$kernels OMP_NUM_THREADS=1 MKL_NUM_THREADS=1 PATH="$(abspath $(BIN)):$$PATH" \
	    $(BIN)/nbdev_test --n_workers 2 --file_re '^($(NUM_NBS))\.ipynb$$' || exit 1; \
	  env $$kernels OMP_NUM_THREADS=1 MKL_NUM_THREADS=1 \
	    $(BIN)/python -m pytest -q -n 2 -m 'numerical or float32' tests || exit 1; \
	done < <($(BIN)/python tools/mkl_paths.py)

pages: install
	# the core chapters (nbs/core_path.txt) run as make test runs them, `slow` cells included, their
	# outputs and a provenance hash written into the committed notebooks, then checked
	PATH="$(abspath $(BIN)):$$PATH" $(BIN)/python tools/pages.py render

docs: install
	# as make test runs the notebooks: two at a time, one BLAS/OpenMP thread each
	OMP_NUM_THREADS=1 MKL_NUM_THREADS=1 PATH="$(abspath $(BIN)):$$PATH" $(BIN)/python tools/docs.py

docs-check: install
	$(BIN)/python tools/pages.py check --strict
	@[ -f _docs/index.html ] || $(MAKE) docs
	# the core chapters' built pages: no stderr, warning, progress bar or traceback in their outputs
	$(BIN)/python tools/pages.py check --site _docs
	$(BIN)/python tools/docs_check.py
