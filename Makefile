# dcp-cdc developer and CI entry points. Nothing here needs an activated venv.
#
#   make setup      .venv from requirements.lock, the project installed editable, Delta jars,
#                   dcp-cdc's log store of local tables (compiled: needs a JDK's javac)
#   make setup-s3   also the jars of a warehouse on S3 (s3a://): hadoop-aws, AWS SDK modules,
#                   dcp-cdc's S3 log store (docs/object-storage.md)
#   make test-unit  the pure tests (tests/unit: no Spark, no Go, no servers beyond loopback
#                   sockets) on two workers, about a minute: the inner loop while editing
#   make test       ruff, mypy --strict on dcp_cdc and pipelines, then pytest over tests/ (2 workers)
#   make check      the same as make test
#   make test-long  silver against the truth over 200 simulator seeds (24 more with one file a
#                   run, shuffled; a late-named collection, whole and killed mid-rename); 200,000 fuzzed frames;
#                   kill -9 at every step; the capture agent through every fault, four server
#                   behaviours × 10 runs and 20 kills;
#                   dcp-cdc run on a standalone Spark cluster; dcp-cdc run --follow stopped
#                   by SIGTERM and started again, killed (kill -9) without leaving its catalog
#                   server behind, and dcp-cdc sql while it runs; the pipeline
#                   DAG run by Airflow's scheduler; the production rehearsal (S3, the shared
#                   catalog, the scheduler, the cluster, queries and maintenance beside the
#                   DAG: tests/e2e/test_rehearsal.py); on a moto S3 server (needs setup-s3):
#                   ingest, apply, check and maintain, and two Spark drivers committing to
#                   the same tables, 20 rounds with each log store; two Spark drivers on the
#                   same local tables, 100 rounds (400 commits), and Delta's stock local store
#                   losing commits to a racing JVM; 13 lines, each a target (long-seeds,
#                   long-follow, ...): make -j2 test-long runs two at once
#   make airflow-up  Airflow under its scheduler (LocalExecutor, API server, DAG processor) and a
#                   Spark standalone cluster on 127.0.0.1, in work/stack; Ctrl-C stops it all
#   make airflow-down  stop what airflow-up started (from another terminal)
#   make s3-up      an S3 API (moto's server, in memory) on 127.0.0.1:9000 with the bucket
#                   `lake`, for a rehearsal on object storage (ARGS=...); Ctrl-C stops it
#   make kill-trials  kill -9 of ingest and apply at random instants, 30 each (ARGS=...)
#   make lock       re-resolve requirements.lock from pyproject.toml (needs PyPI)
#
# setup is stamp-driven: a second run with nothing changed does no work.

SHELL := /bin/bash
.DEFAULT_GOAL := help

PYTHON ?= python3.11
VENV := .venv
PY := $(VENV)/bin/python
# Stamps live inside what they stand for, so deleting .venv or .cache/jars redoes that step.
STAMPS := $(VENV)/.stamps
JARS_DIR := .cache/jars
JARS_STAMP := $(JARS_DIR)/.stamp
S3_JARS_DIR := .cache/jars-s3
S3_JARS_STAMP := $(S3_JARS_DIR)/.stamp
LOCAL_LOG_STORE_JAR := $(JARS_DIR)/dcp-cdc-local-logstore.jar
BUILD_JAR := build-support/jars/build_jar.py
JVM_ARCHIVE_STAMP := .cache/jvm/.stamp
PIP := $(PY) -m pip --disable-pip-version-check

PYTEST_ARGS ?=
ARGS ?=

.PHONY: airflow-up airflow-down s3-up
.PHONY: help setup setup-s3 test-unit test test-long kill-trials check lint format typecheck run bench pyfiles wheel lock clean distclean

help:
	@sed -n 's/^#   make /  make /p' $(MAKEFILE_LIST)
	@echo "  make lint | format | typecheck | run ARGS=... | bench | pyfiles | wheel | clean | distclean"

setup: $(STAMPS)/editable $(JARS_STAMP) $(LOCAL_LOG_STORE_JAR) $(JVM_ARCHIVE_STAMP)

$(PY):
	$(PYTHON) -m venv $(VENV)

# Reinstalls on a changed lock; packages dropped from the lock stay until `make distclean`.
$(STAMPS)/deps: requirements.lock | $(PY)
	$(PIP) install -q -r requirements.lock
	@mkdir -p $(@D) && touch $@

# The editable install also compiles the columnar decoder's pass (dcp_cdc/_native.c).
$(STAMPS)/editable: pyproject.toml dcp_cdc/_native.c $(STAMPS)/deps
	$(PIP) install -q --no-deps --no-build-isolation -e .
	@mkdir -p $(@D) && touch $@

# The jars list depends on the pom and on what the installed pyspark ships (the lock).
$(JARS_STAMP): build-support/jars/pom.xml build-support/jars/fetch_jars.py $(STAMPS)/deps
	$(PY) build-support/jars/fetch_jars.py --dest $(JARS_DIR)
	@mkdir -p $(@D) && touch $@

# The log store every session gives local tables (several writers keep every commit:
# docs/object-storage.md), beside the Delta jars; rebuilt when fetch_jars.py renews the folder.
$(LOCAL_LOG_STORE_JAR): $(JARS_STAMP) $(BUILD_JAR) $(wildcard build-support/jars/local/src/dcpcdc/delta/*.java)
	$(PY) $(BUILD_JAR) --src build-support/jars/local/src --jar $@ --classpath $(JARS_DIR) --needs delta-storage-

# The class-data archive local Spark JVMs map at start (pipelines/lake/jvm_archive.py): one
# JVM run of about a minute, written again when the packages or the jars change.
$(JVM_ARCHIVE_STAMP): build-support/jvm_archive.py pipelines/lake/jvm_archive.py $(STAMPS)/editable $(LOCAL_LOG_STORE_JAR)
	$(PY) build-support/jvm_archive.py --force
	@mkdir -p $(@D) && touch $@

# Only for a warehouse on S3: not part of setup, which stays light.
setup-s3: setup $(S3_JARS_STAMP)

# After the Delta jars (its log store builds against them), which come after the packages.
$(S3_JARS_STAMP): build-support/jars/s3/pom.xml build-support/jars/fetch_jars.py $(BUILD_JAR) $(wildcard build-support/jars/s3/src/dcpcdc/delta/*.java) $(JARS_STAMP)
	$(PY) build-support/jars/fetch_jars.py --pom build-support/jars/s3/pom.xml --dest $(S3_JARS_DIR) --require hadoop-aws
	$(PY) $(BUILD_JAR) --src build-support/jars/s3/src --jar $(S3_JARS_DIR)/dcp-cdc-s3-logstore.jar --classpath $(JARS_DIR) --classpath $(S3_JARS_DIR) --needs delta-storage- --needs hadoop-aws-
	@mkdir -p $(@D) && touch $@

# The inner loop: no lint, no types, no JVM. Two workers: the tests are independent, and the
# slowest few (the agent's faults, the fuzzer) overlap instead of queueing.
test-unit: setup
	$(PY) -m pytest tests/unit -n 2 $(PYTEST_ARGS)

# CI runs this: lint and types first (seconds), then every test on two workers, a file at a
# time per worker (--dist loadfile: a module's fixtures, e.g. test_run's demo, are made once),
# each worker with its own Spark session; the Spark driver waits on py4j and the planner much of
# the time, so two overlap on two cores. The 30 slowest tests close the output: what to look at
# when the run nears its 25 minutes.
test: setup lint typecheck
	$(PY) -m pytest -n 2 --dist loadfile -m "not long" --durations=30 $(PYTEST_ARGS)

check: test

# Silver against the simulator's truth over 200 seeds (CI runs 24), and 24 seeds whose files
# arrive one per run in a shuffled order; both decoder faces over 200,000 fuzzed inputs (make
# test runs 2,000); the tests marked `long` (history and MERGEs in any arrival order, the
# document variant, a later run's rollback with history, more kill points, the pipeline DAG's
# dag.test() and `check` on the demo's warehouse, a capture file lost and skipped through
# the quality check, two Spark drivers committing to the same local tables: minutes each, so
# make test leaves them here, to stay under 25 minutes in CI); kill -9 of ingest and apply at
# every step; the capture agent through each fault into silver, a failover to a shorter branch
# and 20 kill -9 of the agent.
# Each line a target of its own: `make -j2 test-long` runs two at once (each a pytest process
# with its own Spark session, as make test's two workers are), `make long-follow` one alone.
LONG_LINES := long-seeds long-arrival long-fuzz long-check long-marked long-kill long-capture \
	long-cluster long-follow long-s3-kills long-s3 long-airflow long-rehearsal
.PHONY: $(LONG_LINES)
test-long: $(LONG_LINES)
$(LONG_LINES): setup setup-s3

long-seeds:
	DCP_CDC_SEEDS=200 DCP_CDC_ARRIVAL_SEEDS=24 $(PY) -m pytest tests/spark/test_silver.py -k many_seeds $(PYTEST_ARGS)
long-arrival:
	DCP_CDC_ARRIVAL_ALL=1 $(PY) -m pytest tests/spark/test_silver_arrival.py $(PYTEST_ARGS)
long-fuzz:
	DCP_CDC_FUZZ_INPUTS=200000 $(PY) -m pytest tests/unit/test_decoder_fuzz.py $(PYTEST_ARGS)
long-check:
	DCP_CDC_CHECK_GROUPS=10 DCP_CDC_CHECK_SEEDS_PER_GROUP=20 DCP_CDC_CHECK_BATCHES=4 $(PY) -m pytest tests/spark/test_quality_incremental.py $(PYTEST_ARGS)
long-marked:
	$(PY) -m pytest -m long tests/spark/test_silver_history.py tests/spark/test_silver_apply.py tests/spark/test_kill_resume.py tests/spark/test_silver.py::test_incremental_runs_in_any_arrival_order_equal_one_run tests/dags/test_dcp_cdc_dags.py tests/e2e/test_run.py tests/e2e/test_submitted_jars.py tests/spark/test_apply_memory.py tests/spark/test_cluster_branch.py tests/spark/test_landing_gap.py tests/e2e/test_local_writers.py tests/spark/test_silver_live.py tests/e2e/test_initial_load.py $(PYTEST_ARGS)
long-kill:
	DCP_CDC_KILL_ALL=1 $(PY) -m pytest tests/e2e/test_kill.py $(PYTEST_ARGS)
long-capture:
	DCP_CDC_CAPTURE_ALL=1 $(PY) -m pytest tests/spark/test_capture_agent.py $(PYTEST_ARGS)
long-cluster:
	DCP_CDC_CLUSTER=1 $(PY) -m pytest tests/e2e/test_cluster.py $(PYTEST_ARGS)
long-follow:
	DCP_CDC_FOLLOW=1 $(PY) -m pytest tests/spark/test_follow.py tests/e2e/test_follow_cli.py tests/e2e/test_shared_catalog.py $(PYTEST_ARGS)
long-s3-kills:
	DCP_CDC_S3_KILLS=20 $(PY) -m pytest tests/unit/test_agent_s3.py -k kill_9 $(PYTEST_ARGS)
long-s3:
	DCP_CDC_S3=1 $(PY) -m pytest tests/s3 $(PYTEST_ARGS)
long-airflow:
	DCP_CDC_AIRFLOW=1 $(PY) -m pytest tests/e2e/test_airflow_scheduler.py $(PYTEST_ARGS)
long-rehearsal:
	DCP_CDC_REHEARSAL=1 $(PY) -m pytest tests/e2e/test_rehearsal.py $(PYTEST_ARGS)

# build-support/local_stack.py: see its --help and docs/airflow.md (Running under the scheduler).
STACK_DIR ?= work/stack
airflow-up: setup
	$(PY) build-support/local_stack.py up --dir $(STACK_DIR) $(ARGS)

airflow-down:
	$(PY) build-support/local_stack.py down --dir $(STACK_DIR)

# build-support/local_s3.py: docs/deployment.md.
s3-up: setup
	$(PY) build-support/local_s3.py up --bucket lake $(ARGS)

# kill -9 of dcp-cdc ingest and apply at random instants, each run again and checked.
kill-trials: setup
	$(PY) -m benchmarks.kill_trials $(ARGS)

lint: setup
	$(VENV)/bin/ruff check .
	$(VENV)/bin/ruff format --check .

format: setup
	$(VENV)/bin/ruff check --fix .
	$(VENV)/bin/ruff format .

typecheck: setup
	$(VENV)/bin/mypy dcp_cdc pipelines

run: setup
	$(VENV)/bin/dcp-cdc run $(ARGS)

# benchmarks/__main__.py if there is one, else each benchmarks/*.py that has a __main__ block,
# run as a module (python -m benchmarks.NAME) so it imports like the tests do.
bench: setup setup-s3
	@if [ -f benchmarks/__main__.py ]; then \
		$(PY) -m benchmarks $(ARGS); \
	elif compgen -G 'benchmarks/*.py' > /dev/null; then \
		for f in benchmarks/*.py; do \
			grep -q '^if __name__ == "__main__"' "$$f" || continue; \
			mod=$$(basename "$$f" .py); echo "== benchmarks.$$mod"; \
			$(PY) -m "benchmarks.$$mod" $(ARGS) || exit $$?; \
		done; \
	else \
		echo "bench: no benchmarks/ yet"; \
	fi

# The code of dcp_cdc and pipelines as one zip, for [spark] py_files on a cluster: the same
# zip `py_files = "auto"` builds (pipelines/lake/shipping.py), from this checkout's packages.
pyfiles: setup
	$(PY) -m pipelines.lake.shipping --out dist/dcp_cdc.zip

# A wheel of the package with the compiled decoder pass, for executors' Pythons (a zip from
# pyfiles decodes with numpy alone: an extension module cannot be imported from a zip).
wheel: setup
	$(PIP) wheel -q --no-deps --no-build-isolation -w dist .
	@rm -rf build

# A throwaway venv resolves pyproject.toml (with the dev extra) and is frozen into the lock.
# pip itself is left out: the venv's own pip installs the lock.
lock:
	@tmp=$$(mktemp -d) && trap 'rm -rf "$$tmp"' EXIT && \
	$(PYTHON) -m venv "$$tmp/venv" && \
	"$$tmp/venv/bin/pip" install -q --disable-pip-version-check --upgrade pip setuptools && \
	"$$tmp/venv/bin/pip" install -q --disable-pip-version-check -e '.[dev]' && \
	"$$tmp/venv/bin/pip" check && \
	{ echo "# Exact set for Python 3.11, resolved from pyproject.toml by 'make lock'. Do not edit by hand."; \
	  "$$tmp/venv/bin/pip" freeze --all --exclude-editable | grep -v '^pip==' | LC_ALL=C sort -f -t= -k1,1; \
	} > requirements.lock.new && mv requirements.lock.new requirements.lock
	@echo "requirements.lock: $$(grep -c '==' requirements.lock) pins"

clean:
	rm -rf build dist *.egg-info .pytest_cache .mypy_cache .ruff_cache .hypothesis
	rm -rf spark-warehouse metastore_db derby.log
	find . -path ./.venv -prune -o -type d -name __pycache__ -exec rm -rf {} +

distclean: clean
	rm -rf $(VENV) .cache
	rm -f dcp_cdc/_native*.so
