# Two commands on a fresh machine with only python3: `make train` and `make test` (both create .venv).
PYTHON ?= python3
VENV := .venv
PY := $(VENV)/bin/python

RECIPE ?= multi30k-en-de-small
MODULE ?= sinusoidal
MINUTES ?= 16
OUTPUT ?= outputs/$(RECIPE)-$(MODULE)
ARGS ?=
THREADS ?= 1
SYSTEMS ?=

.PHONY: install train train-stock compare test test-all lint bench

$(VENV)/.installed: pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --upgrade pip
	$(PY) -m pip install -e '.[dev]'
	touch $@

install: $(VENV)/.installed

## Train + evaluate on the shipped Multi30k, write a Hub-ready folder (MODULE=learned MINUTES=16 RECIPE=... OUTPUT=...)
train: install
	$(PY) train_scripts/train.py --recipe $(RECIPE) --position_encoding $(MODULE) --minutes $(MINUTES) \
		--output_dir $(OUTPUT) $(ARGS)

## The baseline: stock transformers.MarianMTModel + plain Seq2SeqTrainer, same data, budget and evaluation
train-stock: install
	$(PY) train_scripts/train.py --recipe $(RECIPE) --architecture stock_marian --learning_rate 7e-4 \
		--minutes $(MINUTES) --output_dir outputs/$(RECIPE)-stock-marian $(ARGS)

## Every positional module trained and scored under one recipe, budget and seeds -> docs/results.md
## (CPU default: tiny recipe, 300 updates, seeds 1 2; resumable. ARGS="--tables main --pairs en-de en-fr ...")
compare: install
	$(PY) train_scripts/compare.py $(ARGS)

## The test suite CI runs (slow end-to-end runs excluded)
test: install
	$(PY) -m pytest -q -m "not slow" tests

test-all: install
	$(PY) -m pytest -q tests

lint: install
	$(VENV)/bin/ruff check hf_posenc train_scripts tests benchmarks
	$(VENV)/bin/ruff format --check hf_posenc train_scripts tests benchmarks

## Speed, memory and decoding cost of every registered module vs stock MarianMTModel, as ratios in one process:
## writes docs/benchmarks.md + docs/benchmarks_*.png (SYSTEMS="marian shaw ..." THREADS=1 ARGS="--device cuda --bf16")
bench: install
	$(PY) -m benchmarks.run --threads $(THREADS) $(if $(SYSTEMS),--systems $(SYSTEMS)) $(ARGS)
