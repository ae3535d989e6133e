# Two commands on a fresh clone: `make demo` (the main job) and `make test`.
# Both create .venv if missing and install what they need, pinned by
# constraints.txt (torch's CPU build; an unpinned torch would pull CUDA).
PYTHON ?= python3
VENV   := .venv
PY     := $(VENV)/bin/python
STAMP  := $(VENV)/.installed

.PHONY: demo test lint venv clean

venv: $(STAMP)

$(STAMP): pyproject.toml constraints.txt
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -q --disable-pip-version-check -c constraints.txt -e '.[dev]'
	touch $(STAMP)

demo: $(STAMP)
	$(PY) -m treecoll.tools.demo

# two test files at a time (pytest-xdist, whole files per worker): the multi-process tests wait on
# sockets and shaped links much of their time
test: $(STAMP)
	$(PY) -m pytest -n 2 --dist loadfile

lint: $(STAMP)
	$(PY) -m ruff check .
	$(PY) -m ruff format --check .

clean:
	rm -rf $(VENV) *.egg-info
