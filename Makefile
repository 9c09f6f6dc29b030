# Two commands on a fresh machine with only python3: `make train` and `make test` (both create .venv).
PYTHON ?= python3
VENV := .venv
PY := $(VENV)/bin/python

MODULE ?= sinusoidal
MINUTES ?= 16
SRC ?= en
TGT ?= de
OUTPUT ?= outputs/multi30k-$(SRC)-$(TGT)-$(MODULE)
ARGS ?=

.PHONY: install train train-stock test test-all lint bench

$(VENV)/.installed: pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --upgrade pip
	$(PY) -m pip install -e '.[dev]'
	touch $@

install: $(VENV)/.installed

## Train + evaluate on the shipped Multi30k, write a Hub-ready folder (MODULE=learned MINUTES=16 OUTPUT=...)
train: install
	$(PY) train_scripts/train.py --source_lang $(SRC) --target_lang $(TGT) --position_encoding $(MODULE) \
		--minutes $(MINUTES) --output_dir $(OUTPUT) $(ARGS)

## The baseline: stock transformers.MarianMTModel + plain Seq2SeqTrainer, same data, budget and evaluation
train-stock: install
	$(PY) train_scripts/train.py --source_lang $(SRC) --target_lang $(TGT) --architecture stock_marian \
		--learning_rate 7e-4 --minutes $(MINUTES) --output_dir outputs/multi30k-$(SRC)-$(TGT)-stock-marian $(ARGS)

## The test suite CI runs (slow end-to-end runs excluded)
test: install
	$(PY) -m pytest -q -m "not slow" tests

test-all: install
	$(PY) -m pytest -q tests

lint: install
	$(VENV)/bin/ruff check hf_posenc train_scripts tests benchmarks
	$(VENV)/bin/ruff format --check hf_posenc train_scripts tests benchmarks

bench: install
	$(PY) benchmarks/train_step.py --variants $(filter-out sinusoidal,$(or $(VARIANTS),learned none)) $(ARGS)
