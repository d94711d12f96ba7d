# Quick start: `make demo` runs a simulation, `make test` runs the tests.
# Both set up whatever is missing first (see scripts/setup.sh), then build the C++ engine core
# (scripts/build_core.py: skipped when up to date; if it cannot be built, it says why and what to
# install, and make stops: the core is the engine). `make core` builds it again.
VENV ?= .venv
STAMP := $(VENV)/.hcsim-setup
CORE_STAMP := $(VENV)/.hcsim-core
CORE_SOURCES := $(wildcard hcsim/engine/core/*.cpp hcsim/engine/core/*.hpp hcsim/platform/*.cpp hcsim/workload/*.cpp)

.PHONY: demo test setup bench core clean
demo: $(CORE_STAMP)
	$(VENV)/bin/hcsim simulate

test: $(CORE_STAMP)
	$(VENV)/bin/python -m pytest -q

bench: $(CORE_STAMP)
	$(VENV)/bin/python benchmarks/engine_speed.py

setup: $(CORE_STAMP)

$(STAMP): pyproject.toml constraints.txt scripts/setup.sh
	VENV=$(VENV) scripts/setup.sh
	touch $@

$(CORE_STAMP): $(STAMP) $(CORE_SOURCES) scripts/build_core.py
	$(VENV)/bin/python scripts/build_core.py
	touch $@

core: $(STAMP)
	$(VENV)/bin/python scripts/build_core.py
	touch $(CORE_STAMP)

clean:
	rm -rf $(VENV) build *.egg-info hcsim/engine/core/_core*.so hcsim/platform/_routes*.so hcsim/workload/_order*.so
