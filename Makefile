# Two commands on a fresh machine with Python 3.11+:  make demo   and   make test
PYTHON ?= python3
VENV   := .venv
PY     := $(VENV)/bin/python
STAMP  := $(VENV)/.installed

.PHONY: demo loop test install clean

$(STAMP): pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip
	# CPU build of torch first, so sentence-transformers does not pull multi-GB CUDA wheels.
	$(PY) -m pip install -q torch==2.13.0 --index-url https://download.pytorch.org/whl/cpu --retries 1 \
	  || $(PY) -m pip install -q torch==2.13.0
	# every extra (pyproject.toml): router, forecaster, prophet, plot, sim, train and the test tools
	$(PY) -m pip install -q -e '.[all]'
	touch $(STAMP)

install: $(STAMP)

demo: $(STAMP)
	$(PY) -m sim demo $(ARGS)

# The closed loop (sim/README.md): needs the kube tools built (controller manager, scheduler).
# The data folder: PROMPTEDGE_DATA_DIR, else ../shared/data next to this checkout.
DATA_DIR ?= $(or $(PROMPTEDGE_DATA_DIR),../shared/data)
loop: $(STAMP)
	$(PY) -m sim loop --trace $(DATA_DIR)/traces/servegen-m-large --json out/loop.json --plot out/loop.png $(ARGS)

test: $(STAMP)
	$(PY) -m pytest $(ARGS)

clean:
	rm -rf $(VENV) out
