# Two commands: `make demo` runs the pipeline on the embedded default job; `make test` runs the tests.
# Both create .venv (plain venv + pip) on first use.
PYTHON ?= python3
VENV   := .venv
BIN    := $(abspath $(VENV))/bin
STAMP  := $(VENV)/.prism-installed
export PATH := $(BIN):$(PATH)

.PHONY: demo test setup lint clean

setup: $(STAMP)

$(STAMP): pyproject.toml
	@test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet --disable-pip-version-check -e '.[test]'
	@touch $(STAMP)

demo: $(STAMP)
	$(BIN)/snakemake -s workflow/Snakefile --profile profiles/local
	@echo; $(BIN)/python -m prism.summary --show --job results/default
	@test ! -f results/default/baseline/summary.txt || $(BIN)/python -m prism.summary --show --job results/default/baseline
	@echo "Results of the default job: $(CURDIR)/results/default/ (prism sql --job results/default \"SELECT * FROM ranks\")"
	@test -f results/default/report/report.html && echo "Report: $(CURDIR)/results/default/report/report.html"

test: $(STAMP)
	$(BIN)/python -m pytest -q -ra --durations=30

lint: $(STAMP)
	$(BIN)/snakemake -s workflow/Snakefile --lint

clean:
	rm -rf results .snakemake
