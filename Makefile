# azure-functions-db — one entry point per task. `make help` lists them.
.DEFAULT_GOAL := help
SHELL := /bin/bash

PYTHON ?= python3
VENV   ?= .venv
BIN    := $(VENV)/bin
STAMP  := $(VENV)/.installed

.PHONY: help demo test lint format bench clean

help: ## Show the targets
	@awk 'BEGIN {FS = ":.*## "} /^[a-zA-Z_-]+:.*## / {printf "  make %-8s %s\n", $$1, $$2}' $(MAKEFILE_LIST)

$(STAMP): pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet --upgrade pip
	$(BIN)/python -m pip install --quiet -e '.[dev]'
	touch $(STAMP)

demo: $(STAMP) ## Run a sample poller on a local SQLite table with the local state store
	$(BIN)/afdb demo

test: $(STAMP) ## Run the whole test suite
	$(BIN)/python -m pytest

lint: $(STAMP) ## ruff (lint + format check) and mypy --strict
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .
	$(BIN)/mypy

format: $(STAMP) ## Apply ruff fixes and formatting
	$(BIN)/ruff check --fix .
	$(BIN)/ruff format .

bench: $(STAMP) ## Run the benchmarks (ratios against a baseline in the same run)
	$(BIN)/python -m benchmarks

clean: ## Remove the virtualenv, caches and demo files
	rm -rf $(VENV) .afdb .pytest_cache .mypy_cache .ruff_cache .hypothesis
