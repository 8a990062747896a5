# The two commands of the README: `make run` and `make test`.
# `make run` and `make cluster` install only what the broker needs; the test tools come
# with `make test` (and `make lint`, `make install`), the profilers with `make bench`.
PYTHON ?= python3
VENV ?= .venv
BIN := $(VENV)/bin
CHECKSUM := $(shell cat pyproject.toml | cksum | cut -d' ' -f1)
STAMP_RUN := $(VENV)/.installed-run-$(CHECKSUM)
STAMP_TEST := $(VENV)/.installed-test-$(CHECKSUM)
STAMP_BENCH := $(VENV)/.installed-bench-$(CHECKSUM)

.PHONY: run test lint typecheck install bench clean cluster

$(STAMP_RUN): pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(BIN)/pip install --quiet --upgrade pip
	$(BIN)/pip install --quiet -e .
	rm -f $(VENV)/.installed-run-*
	touch $@

$(STAMP_TEST): $(STAMP_RUN)
	$(BIN)/pip install --quiet -e '.[test]'
	rm -f $(VENV)/.installed-test-*
	touch $@

$(STAMP_BENCH): $(STAMP_TEST)
	$(BIN)/pip install --quiet -e '.[test,bench]'
	rm -f $(VENV)/.installed-bench-*
	touch $@

install: $(STAMP_TEST)

## Start a single-node broker: client 127.0.0.1:7450, HTTP 127.0.0.1:7452, data in ./data.
run: $(STAMP_RUN)
	$(BIN)/futureq start

## Start a local 3-node cluster (clients on 7450, 7460, 7470; data in ./data-cluster).
## Ctrl-C stops every node gracefully (a second Ctrl-C kills them). Each node runs one shard
## per core (auto: the count recorded in its data directory); SHARDS=N: N shards per node.
cluster: $(STAMP_RUN)
	$(BIN)/python -m futureq.cli.local_cluster --nodes $(or $(NODES),3) --shards $(or $(SHARDS),auto)

## Install test dependencies and run the whole test suite.
test: $(STAMP_TEST)
	$(BIN)/python -m pytest $(PYTEST_ARGS)

lint: $(STAMP_TEST)
	$(BIN)/ruff check src tests bench
	$(BIN)/ruff format --check src tests bench
	$(BIN)/mypy

bench: $(STAMP_BENCH)
	$(BIN)/python -m bench.run_all

clean:
	rm -rf $(VENV) $(K8S_VENV) .pytest_cache .mypy_cache .ruff_cache

## Fault-injection run: 3 nodes, mixed faults, 5 minutes (JEPSEN_ARGS to change it).
## The CI selection of fault-injection runs (a few minutes, seeded).
.PHONY: jepsen-ci
jepsen-ci: $(STAMP_TEST)
	$(BIN)/python -m pytest tests/jepsen_like -m jepsen --run-slow -p no:cacheprovider

.PHONY: jepsen
JEPSEN_ARGS ?= --nodes 3 --time 300 --nemesis mixed --rate 20 --out $${TMPDIR:-/tmp}/futureq-jepsen
jepsen: $(STAMP_TEST)
	$(BIN)/python -m tests.jepsen_like run $(JEPSEN_ARGS)

## Validate the Kubernetes manifests in k8s/: schemas of a pinned Kubernetes version
## (strict: unknown fields are errors) and checkov's Kubernetes policies (skips are
## annotated in the manifests with their reasons). Each tool is also run on a bad file
## it must refuse, so a check that stopped checking cannot pass.
K8S_VENV ?= .venv-k8s
K8S_VERSION ?= 1.32.0
K8S_STAMP := $(K8S_VENV)/.installed-$(shell cat requirements-k8s.txt | cksum | cut -d' ' -f1)

$(K8S_STAMP): requirements-k8s.txt
	$(PYTHON) -m venv $(K8S_VENV)
	$(K8S_VENV)/bin/pip install --quiet -r requirements-k8s.txt
	rm -f $(K8S_VENV)/.installed-*
	touch $@

.PHONY: k8s-check
k8s-check: $(K8S_STAMP)
	$(K8S_VENV)/bin/kubernetes-validate --strict --kubernetes-version $(K8S_VERSION) --quiet k8s/*.yaml
	! $(K8S_VENV)/bin/kubernetes-validate --strict --kubernetes-version $(K8S_VERSION) --quiet \
		tests/k8s_fixtures/bad-unknown-field.yaml > /dev/null
	$(K8S_VENV)/bin/checkov --directory k8s --framework kubernetes --skip-download --compact --quiet
	! $(K8S_VENV)/bin/checkov --file tests/k8s_fixtures/bad-privileged.yaml --framework kubernetes \
		--skip-download --compact --quiet > /dev/null
	@echo "k8s-check: every manifest in k8s/ is valid for Kubernetes $(K8S_VERSION) and passes checkov"
