# The two commands of the quick start: `make run` and `make test`. Each sets up what it
# needs on a fresh machine (a virtual environment in .venv; system packages via apt-get
# for the tests that need real servers), so nothing has to be installed by hand.

VENV  ?= .venv
PY    := $(VENV)/bin/python
SUM   := $(shell cksum pyproject.toml | cut -d' ' -f1)
# One stamp per install, so each target installs only what it needs: `make run` what a router
# needs (`pip install -e .`: no PySpark, no test tools), `make test` the development extras.
STAMP := $(VENV)/.installed-run-$(SUM)
DEV   := $(VENV)/.installed-dev-$(SUM)
# `make run`'s port (its HTTP endpoint takes the next one): `make run PORT=7450` if 7447 is taken.
PORT  ?= 7447
# Discovery never leaves loopback unless the operator says otherwise.
export AA_DISCOVERY_INTERFACES ?= lo

.PHONY: run test lint bench system-deps clean

$(PY):
	python3 -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip

# Spark's class archive is not made here: the first `aa mine` writes it (and says so), or
# `aa mine prepare` ahead; a router never waits for it.
$(STAMP): pyproject.toml | $(PY)
	$(PY) -m pip install -q -e .
	rm -f $(VENV)/.installed-run-*
	touch $@

$(DEV): pyproject.toml | $(PY)
	$(PY) -m pip install -q -e '.[dev]'
	rm -f $(VENV)/.installed-*
	touch $@ $(STAMP)

## run: a router on 127.0.0.1:$(PORT), 7447 by default (data in .aa-data/) hosting the bundled add-ins in the
## same process (simulated office: weather, quotes, ticker adapter, laptops, phones), so a
## newcomer's `aa subscribe` sees events at once
run: $(STAMP)
	$(VENV)/bin/aa router --host 127.0.0.1 --port $(PORT) --data-dir .aa-data --bundled -v

## test: the formatter and linter, then the whole test suite (installs PostgreSQL etc.
## through apt-get when root), then the codec, router and client tests again on the
## pure-Python event path, the reference (AA_PURE_PYTHON=1; the first run takes the compiled
## path when the install built it: `aa --version` says; when it did not, the first run was
## the pure path already and the second pass is skipped)
PURE_PATH_TESTS := tests/test_mesh_codec.py tests/test_faults_wire_fuzz.py \
	tests/test_session_bad_input.py tests/test_router.py tests/test_client_sync.py \
	tests/test_client_failover.py \
	tests/test_compiled_golden.py tests/test_dispatch_batch.py tests/test_compiled_stamp.py \
	tests/test_compiled_publishes.py
# Two workers (pytest-xdist), one per core: a test file is one unit of work, the Spark tests
# one group sent first (tests/conftest.py). `make test WORKERS=0` runs in one process.
WORKERS ?= 2
XDIST   := -n $(WORKERS) --dist loadfile --no-loadscope-reorder
test: $(DEV) lint system-deps
	$(PY) -m pytest $(XDIST) -m "not alone"
	$(PY) -m pytest -m alone
	@if $(PY) -c 'import sys; from aa.mesh._speedups import COMPILED; sys.exit(not COMPILED)'; \
	then AA_PURE_PYTHON=1 $(PY) -m pytest $(XDIST) $(PURE_PATH_TESTS); \
	else echo "the event path is pure Python already ($$($(VENV)/bin/aa --version)): no second pass"; fi

## lint: ruff's formatter and linter over the whole tree (config: [tool.ruff] in pyproject.toml)
lint: $(DEV)
	$(VENV)/bin/ruff format --check .
	$(VENV)/bin/ruff check .

system-deps:
	bash tests/setup/system-deps.sh

## bench: the benchmarks of tests/bench (not part of the test suite)
bench: $(DEV)
	$(PY) tests/bench/run_all.py

## docs: the manual (docs/, mkdocs.yml) served on http://127.0.0.1:8000/, rebuilt as you edit
.PHONY: docs
docs: $(DEV)
	$(VENV)/bin/mkdocs serve -a 127.0.0.1:8000

clean:
	rm -rf $(VENV) .aa-data .pytest_cache
