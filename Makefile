# nextloc: two commands on a fresh machine: `make run` (the main job) and `make test` (the test suite).
SHELL := /bin/bash
PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
# torch's build: PyPI's CUDA build of the pinned version where `nvidia-smi -L` lists a GPU, else the local
# CPU wheel ($$PIP_FIND_LINKS); NEXTLOC_TORCH=cpu|cuda decides instead (docs/performance.md).
NEXTLOC_TORCH ?= $(shell nvidia-smi -L 2>/dev/null | grep -q '^GPU ' && echo cuda || echo cpu)
TORCH_BUILD := $(NEXTLOC_TORCH)
ifeq ($(filter cpu cuda,$(TORCH_BUILD)),)
$(error NEXTLOC_TORCH=$(TORCH_BUILD): expected cpu or cuda)
endif
STAMP := $(VENV)/.installed-$(TORCH_BUILD)
# Telemetry off for every tool make runs (make starts before Python; the one Python home of these
# variables is flows.OFFLINE_DEFAULTS in flows/__init__.py: keep the two in step).
export DO_NOT_TRACK := true
export PREFECT_SERVER_ANALYTICS_ENABLED := false
export MLFLOW_DISABLE_TELEMETRY := true
export PREFECT_SERVER_EPHEMERAL_STARTUP_TIMEOUT_SECONDS := 120

.PHONY: install torch-plan system-deps raw-data run test test-kernels test-fast lint format bench clean services services-stop services-status

install: system-deps $(STAMP)  ## create .venv and install nextloc with its pinned stack (CPU torch)

# Debian packages the services, the web maps and the browser tests need: PostgreSQL 15 (make services),
# Leaflet and Leaflet.markercluster (the .html maps inline their files: nextloc/maps/web.py),
# Chromium + ChromeDriver (tests/browser), certutil (libnss3-tools: the HTTPS UI test trusts the services' CA
# in Chromium), ip and curl (the HTTPS test's network namespace and its client). Installed only when missing and only as root with apt-get;
# elsewhere the command says what to install and the tests that need them say why they skip.
SYSTEM_PACKAGES := postgresql chromium chromium-driver libjs-leaflet libjs-leaflet.markercluster libnss3-tools iproute2 curl
system-deps:
	@missing=""; \
	command -v /usr/lib/postgresql/15/bin/postgres >/dev/null 2>&1 || missing="$$missing postgresql"; \
	command -v chromium >/dev/null 2>&1 || missing="$$missing chromium"; \
	command -v chromedriver >/dev/null 2>&1 || missing="$$missing chromium-driver"; \
	command -v certutil >/dev/null 2>&1 || missing="$$missing libnss3-tools"; \
	command -v ip >/dev/null 2>&1 || missing="$$missing iproute2"; \
	command -v curl >/dev/null 2>&1 || missing="$$missing curl"; \
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

# uv installs the pinned set in about 10 s (8.3 s from a fresh clone here) where pip takes 1 to 2 min; pip is the fallback.
# torch goes first, pinned. CPU: the local +cpu wheel ($$PIP_FIND_LINKS, which pip reads and uv is given); a
# looser spec, or uv without the find-links, downloads a multi-GB CUDA build. CUDA: the same version from
# PyPI, whose Linux wheel is the CUDA build (never the local +cpu one). A stamp per build: switching reinstalls torch.
# Bytecode: where PYTHONDONTWRITEBYTECODE is set (many containers, this CI) nothing would ever be cached, and
# every command and worker process compiled its imports again (a cached run 13 s, not 7). The targets below
# unset it, so Python caches the bytecode of what is imported, once, as it does by default; compiling every
# installed file at install took about 20 s.
unexport PYTHONDONTWRITEBYTECODE
UV_PIP := VIRTUAL_ENV=$(VENV) $(BIN)/uv pip install --python $(BIN)/python -c constraints.txt
UV := $(UV_PIP) -q
TORCH_FROM := $(if $(filter cpu,$(TORCH_BUILD)),$(if $(PIP_FIND_LINKS),--find-links "$(PIP_FIND_LINKS)"))
TORCH_PIP_ENV := $(if $(filter cuda,$(TORCH_BUILD)),env -u PIP_FIND_LINKS)
$(STAMP): pyproject.toml constraints.txt
	test -d $(VENV) || $(PYTHON) -m venv $(VENV)
	rm -f $(VENV)/.installed*
	if $(BIN)/python -m pip install -q -c constraints.txt uv \
	    && $(UV) $(TORCH_FROM) --reinstall-package torch torch \
	    && $(UV) -e '.[dev,dask]'; then \
	  echo "installed with uv"; \
	else \
	  echo "uv could not install: installing with pip"; \
	  $(TORCH_PIP_ENV) $(BIN)/python -m pip install -q -c constraints.txt --force-reinstall torch \
	    && $(BIN)/python -m pip install -q -c constraints.txt -e '.[dev,dask]'; \
	fi
	$(BIN)/python -m pip check
	$(BIN)/python -c 'import torch; print(f"torch {torch.__version__}: CUDA {torch.version.cuda}, GPU available: {torch.cuda.is_available()}")'
	touch $(STAMP)

torch-plan:  ## which torch build `make install` takes on this machine, and what uv would install for it (a dry run)
	@echo "torch build: $(TORCH_BUILD)"
	$(UV_PIP) --dry-run $(TORCH_FROM) --reinstall-package torch torch

# The raw data is unpacked while the install runs (python -m nextloc.raw.rawdata needs only the standard
# library; it never downloads and always exits 0: the job finds, fetches or reports the data itself).
run:  ## preprocess GeoLife (found via $$NEXTLOC_GEOLIFE_DIR, data/raw/geolife, a local archive, or downloaded)
	@$(MAKE) --no-print-directory -j3 install raw-data
	$(BIN)/nextloc run

raw-data:  ## unpack a local GeoLife archive into data/raw/geolife, if the job would (no download)
	$(PYTHON) -m nextloc.raw.rawdata

# Two pytest workers (pytest-xdist), a test file each at a time: most tests wait on a server, a subprocess
# or the disk, so two keep both cores busy. The files go in collection order with the slow ones first
# (tests/conftest.py), not xdist's default of the files with most tests first, which left the longest
# single-test files to the end. TEST_WORKERS=0 runs the suite in this one process.
TEST_WORKERS ?= 2
test: install  ## lint + the whole test suite (full-data tests run when ../shared has the GeoLife archive)
	$(BIN)/ruff check .
	$(BIN)/python -m pytest -n $(TEST_WORKERS) --dist loadfile --no-loadscope-reorder --durations=25

# The numeric tests on other CPU kernels: torch's dispatch at each capability (ATEN_CPU_CAPABILITY), then
# oneDNN, MKL and NumPy held to AVX2 under the native capability name. Each run holds the recipes to every
# recorded machine's digests (tests/nextloc/training/test_kernels.py: bits where the kernels are the
# recording's, the tolerant path elsewhere). KERNEL_RUNS picks the runs (CI: `default avx2 held`, after
# make test has run them natively).
KERNEL_RUNS ?= native default avx2 held
KERNEL_TESTS ?= tests/nextloc
test-kernels: install  ## the library's tests under other CPU kernels (about 2.5 min a run on 2 cores)
	@set -e; for run in $(KERNEL_RUNS); do \
	  case $$run in \
	    native) settings=();; \
	    default|avx2) settings=(ATEN_CPU_CAPABILITY=$$run);; \
	    held) settings=(DNNL_MAX_CPU_ISA=AVX2 MKL_ENABLE_INSTRUCTIONS=AVX2 "NPY_DISABLE_CPU_FEATURES=X86_V4 AVX512_ICL AVX512_SPR");; \
	    *) echo "KERNEL_RUNS: unknown run '$$run' (native, default, avx2, held)" >&2; exit 2;; \
	  esac; \
	  echo "== kernels: $$run $${settings[*]}"; \
	  env "$${settings[@]}" $(BIN)/python -m pytest -q -n $(TEST_WORKERS) --dist loadfile $(KERNEL_TESTS); \
	done

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
