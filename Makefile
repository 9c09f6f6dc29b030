# `make train` and `make test` need python3 and nothing else installed: both create .venv and install the package
# into it with the dev extra (from PyPI). `make test` also downloads the installed transformers version's source
# distribution for transformers' own model tests; `make train` reads its data under HF_POSENC_DATA (below).
# The other targets: train-stock, compare, test-all, lint, bench, docs (README.md, "Other targets").
# Variables left empty pass nothing: the recipe (hf_posenc/pipeline/training/recipes/) and the config decide the
# defaults.
PYTHON ?= python3
# The data root: a recipe's relative data paths are read under it (the shared data beside this checkout).
export HF_POSENC_DATA ?= $(abspath ../shared/data)
VENV := .venv
PY := $(VENV)/bin/python

RECIPE ?= multi30k-en-de-small
MODULE ?=
MINUTES ?=
OUTPUT ?=
ARGS ?=
THREADS ?= 1
SYSTEMS ?=

.PHONY: install train train-stock compare test test-all lint bench docs

$(VENV)/.installed: pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --upgrade pip
	$(PY) -m pip install -e '.[dev]'
	touch $@

# transformers' own common model tests (ModelTesterMixin, tests/test_modeling_common.py) ship in its source
# distribution, not in the wheel: fetch the sdist of the installed version from PyPI and keep its tests/
# (tests/model/test_transformers_model_tests.py runs them against our models), plus what those files import. The
# sdist lacks tests/generation/ (GenerationTesterMixin): its tests run where the environment variable
# HF_POSENC_TRANSFORMERS_GENERATION_TESTS names the tests/ folder of a transformers source checkout, and are skipped
# by name without it (docs/architecture.md).
TRANSFORMERS_SRC := .transformers-src
$(TRANSFORMERS_SRC)/.unpacked: $(VENV)/.installed
	rm -rf $(TRANSFORMERS_SRC) && mkdir -p $(TRANSFORMERS_SRC)
	version=$$($(PY) -c "import transformers; print(transformers.__version__)") && \
	$(PY) -m pip download --no-deps --no-binary :all: --dest $(TRANSFORMERS_SRC) "transformers==$$version" && \
	tar -xzf $(TRANSFORMERS_SRC)/transformers-$$version.tar.gz -C $(TRANSFORMERS_SRC) --strip-components=1 \
		transformers-$$version/tests && \
	rm $(TRANSFORMERS_SRC)/transformers-$$version.tar.gz && echo $$version > $(TRANSFORMERS_SRC)/VERSION
	touch $@

install: $(VENV)/.installed

## Train + evaluate on the shipped Multi30k, write a Hub-ready folder (MODULE=learned MINUTES=16 RECIPE=... OUTPUT=...)
train: install
	$(PY) train_scripts/train.py --recipe $(RECIPE) $(if $(MODULE),--position_encoding $(MODULE)) \
		$(if $(MINUTES),--minutes $(MINUTES)) $(if $(OUTPUT),--output_dir $(OUTPUT)) $(ARGS)

## The baseline: stock transformers.MarianMTModel with the Trainer's own sentence batches, same data, budget, evaluation
train-stock: install
	$(PY) train_scripts/train.py --recipe $(RECIPE) --architecture stock_marian --learning_rate 7e-4 \
		--precision fp32 --per_device_train_batch_size 64 $(if $(MINUTES),--minutes $(MINUTES)) \
		--output_dir $(or $(OUTPUT),outputs/$(RECIPE)-stock-marian) $(ARGS)

## Every positional module trained and scored under one recipe, budget and seeds -> docs/results.md (resumable)
compare: install
	$(PY) -m study --readme README.md $(ARGS)

## The test suite CI runs (slow end-to-end runs excluded), in TEST_WORKERS processes (pytest-xdist; each test
## file (or class) in one of them, in the order tests/conftest.py gives the files: the long ones first)
TEST_WORKERS ?= 2
test: install $(TRANSFORMERS_SRC)/.unpacked
	$(PY) -m pytest -q -n $(TEST_WORKERS) --dist loadscope --no-loadscope-reorder -m "not slow" tests

test-all: install $(TRANSFORMERS_SRC)/.unpacked
	$(PY) -m pytest -q -n $(TEST_WORKERS) --dist loadscope --no-loadscope-reorder tests

lint: install
	$(VENV)/bin/ruff check hf_posenc train_scripts tests benchmarks study tools
	$(VENV)/bin/ruff format --check hf_posenc train_scripts tests benchmarks study tools

## Speed, memory and decoding cost of every registered module vs stock MarianMTModel, as ratios in one process:
## writes docs/benchmarks.md + docs/benchmarks_*.png; SIZE=base|big writes docs/benchmarks-SIZE.*
## (SYSTEMS="marian shaw ..." THREADS=1 PHASES=training; ARGS="--device cuda" measures on a GPU, "--compile"
## also trains every system under torch.compile; ARGS="--help" lists the runner's flags)
bench: install
	$(PY) -m benchmarks.run --threads $(THREADS) $(if $(SIZE),--config $(SIZE)) \
		$(if $(PHASES),--phases $(PHASES)) $(if $(SYSTEMS),--systems $(SYSTEMS)) $(ARGS)

## Regenerate the tables docs/ derives from the code (recipes, module hyperparameters)
docs: install
	$(PY) -m tools.reference_tables
