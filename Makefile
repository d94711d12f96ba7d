# Quick start: `make demo` runs a simulation, `make test` runs the tests.
# Both set up whatever is missing first (see scripts/setup.sh).
VENV ?= .venv
STAMP := $(VENV)/.hcsim-setup

.PHONY: demo test setup bench clean
demo: $(STAMP)
	$(VENV)/bin/hcsim simulate

test: $(STAMP)
	$(VENV)/bin/python -m pytest -q

bench: $(STAMP)
	$(VENV)/bin/python benchmarks/engine_speed.py

setup: $(STAMP)

$(STAMP): pyproject.toml constraints.txt scripts/setup.sh
	VENV=$(VENV) scripts/setup.sh
	touch $@

clean:
	rm -rf $(VENV) build *.egg-info
