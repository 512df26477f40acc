# gpu-asgd: `make demo` trains 1 server + 4 clients; `make test` runs the suite.
VENV ?= .venv
BIN := $(VENV)/bin
DEMO_OUT ?= runs/demo

.PHONY: setup demo test clean

setup: $(VENV)/.setup-done

$(VENV)/.setup-done: setup.cfg scripts/setup.sh
	VENV=$(VENV) scripts/setup.sh
	touch $@

demo: setup
	rm -rf $(DEMO_OUT)
	$(BIN)/mpiexec -n 5 $(BIN)/asgd train --clients 4 --out $(DEMO_OUT)
	$(BIN)/asgd report $(DEMO_OUT)

test: setup
	$(BIN)/python -m pytest -q

clean:
	rm -rf runs results .pytest_cache
