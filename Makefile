# nextloc: two commands on a fresh machine: `make run` (the main job) and `make test` (the test suite).
SHELL := /bin/bash
PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed
# Telemetry off for every tool make runs (make starts before Python; the one Python home of these
# variables is flows.OFFLINE_DEFAULTS in flows/__init__.py: keep the two in step).
export DO_NOT_TRACK := true
export PREFECT_SERVER_ANALYTICS_ENABLED := false
export MLFLOW_DISABLE_TELEMETRY := true
export PREFECT_SERVER_EPHEMERAL_STARTUP_TIMEOUT_SECONDS := 120

.PHONY: install system-deps raw-data run test test-fast lint format bench clean services services-stop services-status

install: system-deps $(STAMP)  ## create .venv and install nextloc with its pinned stack (CPU torch)

# Debian packages the services, the web maps and the browser tests need: PostgreSQL 15 (make services),
# Leaflet and Leaflet.markercluster (the .html maps inline their files: nextloc/webmaps.py),
# Chromium + ChromeDriver (tests/browser). Installed only when missing and only as root with apt-get;
# elsewhere the command says what to install and the tests that need them say why they skip.
SYSTEM_PACKAGES := postgresql chromium chromium-driver libjs-leaflet libjs-leaflet.markercluster
system-deps:
	@missing=""; \
	command -v /usr/lib/postgresql/15/bin/postgres >/dev/null 2>&1 || missing="$$missing postgresql"; \
	command -v chromium >/dev/null 2>&1 || missing="$$missing chromium"; \
	command -v chromedriver >/dev/null 2>&1 || missing="$$missing chromium-driver"; \
	test -f /usr/share/javascript/leaflet/leaflet.js || missing="$$missing libjs-leaflet"; \
	test -f /usr/share/javascript/leaflet/leaflet.markercluster.js || missing="$$missing libjs-leaflet.markercluster"; \
	if [ -n "$$missing" ]; then \
	  if [ "$$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1; then \
	    echo "installing Debian packages:$$missing"; \
	    DEBIAN_FRONTEND=noninteractive apt-get update -qq && \
	    DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends $$missing >/dev/null; \
	  else \
	    echo "note: missing Debian packages:$$missing (sudo apt-get install$$missing); services and browser tests need them"; \
	  fi; \
	fi

# uv installs the pinned set in about 10 s (8.3 s from a fresh clone here) where pip takes 1 to 2 min; pip is the fallback. torch goes first,
# pinned: the local +cpu wheel ($$PIP_FIND_LINKS, which pip reads and uv is given); a looser spec, or uv
# without the find-links, downloads a multi-GB CUDA build. Bytecode: where PYTHONDONTWRITEBYTECODE is set
# (many containers, this CI) nothing would ever be cached, and every command and worker process compiled its
# imports again (a cached run 13 s, not 7). The targets below unset it, so Python caches the bytecode of
# what is imported, once, as it does by default; compiling every installed file at install took about 20 s.
unexport PYTHONDONTWRITEBYTECODE
UV := VIRTUAL_ENV=$(VENV) $(BIN)/uv pip install -q --python $(BIN)/python -c constraints.txt
$(STAMP): pyproject.toml constraints.txt
	test -d $(VENV) || $(PYTHON) -m venv $(VENV)
	if $(BIN)/python -m pip install -q -c constraints.txt uv \
	    && $(UV) $${PIP_FIND_LINKS:+--find-links "$$PIP_FIND_LINKS"} torch \
	    && $(UV) -e '.[dev,dask]'; then \
	  echo "installed with uv"; \
	else \
	  echo "uv could not install: installing with pip"; \
	  $(BIN)/python -m pip install -q -c constraints.txt torch \
	    && $(BIN)/python -m pip install -q -c constraints.txt -e '.[dev,dask]'; \
	fi
	$(BIN)/python -m pip check
	touch $(STAMP)

# The raw data is unpacked while the install runs (python -m nextloc.raw.rawdata needs only the standard
# library; it never downloads and always exits 0: the job finds, fetches or reports the data itself).
run:  ## preprocess GeoLife (found via $$NEXTLOC_GEOLIFE_DIR, data/raw/geolife, a local archive, or downloaded)
	@$(MAKE) --no-print-directory -j3 install raw-data
	$(BIN)/nextloc run

raw-data:  ## unpack a local GeoLife archive into data/raw/geolife, if the job would (no download)
	$(PYTHON) -m nextloc.raw.rawdata

# Two pytest workers (pytest-xdist), a test file each at a time: most tests wait on a server, a subprocess
# or the disk, so two keep both cores busy. TEST_WORKERS=0 runs the suite in this one process.
TEST_WORKERS ?= 2
test: install  ## lint + the whole test suite (full-data tests run when ../shared has the GeoLife archive)
	$(BIN)/ruff check .
	$(BIN)/python -m pytest -n $(TEST_WORKERS) --dist loadfile --durations=25

test-fast: install
	$(BIN)/python -m pytest -m "not slow"

lint: install
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .

format: install
	$(BIN)/ruff format .
	$(BIN)/ruff check --fix .

services: install  ## background PostgreSQL :5433, Prefect server :4200, MLflow server :5000, work pool + worker (logs in .services/)
	$(BIN)/nextloc services start

services-stop:  ## stop what `make services` started (worker first, PostgreSQL last)
	$(BIN)/nextloc services stop

services-status:
	$(BIN)/nextloc services status

bench: install  ## every speed target against the reference (preprocess, the whole job, training): one JSON on stdout
	$(BIN)/python benchmarks/all.py

clean:
	rm -rf .prefect data/geolife .pytest_cache .ruff_cache
