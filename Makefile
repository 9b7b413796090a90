# smartcache — the front door. `make run` and `make test` set everything up
# on a fresh Debian 12 machine (as root) and then run.

PYTHON ?= python3.11
VENV   := .venv
PY     := $(VENV)/bin/python
STAMP  := $(VENV)/.installed-$(shell cat pyproject.toml constraints.txt | md5sum | cut -c1-8)

.PHONY: help run test test-unit lint fmt bench bench-resharding fuzz clean reset-data sysdeps venv lua-test docker-test test-faults console-assets
.DEFAULT_GOAL := help

help:  ## list the targets (this text)
	@awk 'BEGIN {FS = ":[^#]*## "} /^[a-zA-Z_-]+:.*## / {printf "  make %-12s %s\n", $$1, $$2}' $(MAKEFILE_LIST)

# apt waits for another apt (a second make in another shell) instead of failing at once
APT_GET := DEBIAN_FRONTEND=noninteractive apt-get -o DPkg::Lock::Timeout=600

sysdeps:  ## Debian packages: tarantool, etcd-server, lua-check, faketime (clock tests), chromium + chromium-driver (the console's browser tests), npm (fetches uPlot), python venv support
	@missing=""; \
	command -v tarantool >/dev/null || missing="$$missing tarantool"; \
	command -v chromium  >/dev/null || missing="$$missing chromium"; \
	command -v chromedriver >/dev/null || missing="$$missing chromium-driver"; \
	command -v luacheck  >/dev/null || missing="$$missing lua-check"; \
	command -v etcd      >/dev/null || missing="$$missing etcd-server"; \
	command -v faketime  >/dev/null || missing="$$missing faketime"; \
	command -v npm       >/dev/null || missing="$$missing npm"; \
	$(PYTHON) -c 'import ensurepip, venv' 2>/dev/null || missing="$$missing python3-venv"; \
	if [ -n "$$missing" ]; then \
		echo "installing:$$missing"; \
		$(APT_GET) update -qq && $(APT_GET) install -y -qq $$missing >/dev/null; \
	fi

$(STAMP): pyproject.toml constraints.txt
	$(MAKE) sysdeps
	rm -f $(VENV)/.installed-*
	$(PYTHON) -m venv $(VENV)
	@# a .venv made before the distribution was renamed (smartcache -> smartcache-bank) holds the old one
	@$(VENV)/bin/pip uninstall -q -y --disable-pip-version-check smartcache 2>/dev/null || true
	$(VENV)/bin/pip install -q --disable-pip-version-check -c constraints.txt -e '.[dev]'
	touch $@

venv: sysdeps $(STAMP) console-assets  ## create .venv with the pinned Python packages (again when pyproject.toml or constraints.txt change), and the console's uPlot

# The console's charting library: uPlot, one pinned version, fetched by npm (`npm pack` checks the tarball
# against the registry's integrity and names no host here), checked again against the pinned sha512
# before it is unpacked into a git-ignored vendor dir. npm comes with sysdeps (Debian's npm where missing).
UPLOT_VERSION   := 1.6.32
UPLOT_INTEGRITY := sha512-KIMVnG68zvu5XXUbC4LQEPnhwOxBuLyW1AHtpm6IKTXImkbLgkMy+jabjLgSLMasNuGGzQm/ep3tOkyTxpiQIw==
UPLOT_DIR       := service/smartcache/console/static/vendor/uplot
UPLOT_STAMP     := $(UPLOT_DIR)/.version-$(UPLOT_VERSION)

console-assets: sysdeps $(UPLOT_STAMP)  ## the console's uPlot (pinned, sha512-checked) by npm pack into service/smartcache/console/static/vendor

$(UPLOT_STAMP):
	@rm -rf $(UPLOT_DIR) && mkdir -p $(UPLOT_DIR)
	@echo "fetching uPlot $(UPLOT_VERSION): npm pack uplot@$(UPLOT_VERSION)"
	@npm pack --silent --ignore-scripts --pack-destination $(UPLOT_DIR) uplot@$(UPLOT_VERSION) >/dev/null
	@mv $(UPLOT_DIR)/uplot-$(UPLOT_VERSION).tgz $(UPLOT_DIR)/uplot.tgz
	@got="sha512-$$(openssl dgst -sha512 -binary $(UPLOT_DIR)/uplot.tgz | base64 -w0)"; \
	if [ "$$got" != "$(UPLOT_INTEGRITY)" ]; then \
		echo "uPlot $(UPLOT_VERSION): integrity $$got, expected $(UPLOT_INTEGRITY): refused"; rm -rf $(UPLOT_DIR); exit 1; fi
	@tar -xzf $(UPLOT_DIR)/uplot.tgz -C $(UPLOT_DIR) --strip-components=2 package/dist/uPlot.iife.min.js package/dist/uPlot.min.css
	@tar -xzOf $(UPLOT_DIR)/uplot.tgz package/LICENSE > $(UPLOT_DIR)/LICENSE
	@rm $(UPLOT_DIR)/uplot.tgz && touch $@

run: venv  ## start etcd, three Tarantool instances (one elected leader), the service and the simulated backend; Ctrl-C stops all
	$(PY) -m smartcache.devstack

test: venv  ## the whole test suite: Lua tap tests, then pytest
	$(MAKE) lua-test
	$(PY) -m pytest --durations=25

test-unit: venv  ## the unit tests only (tests/unit): no processes, no network, seconds; the loop to run while editing
	$(PY) -m pytest -q tests/unit

test-faults: venv  ## fault suite, as root (see docs/development.md for how long): kill -9, SIGSTOP, partitions, disks, memtx, clock; var/faults.json
	@missing=""; command -v nft >/dev/null || missing="$$missing nftables"; \
	if [ -n "$$missing" ]; then echo "installing:$$missing"; \
		$(APT_GET) update -qq && $(APT_GET) install -y -qq $$missing >/dev/null; fi
	$(PY) -m pytest -q -p no:cacheprovider -o python_files='selftest_*.py' tests/faults
	timeout --kill-after=30 2700 $(PY) -m tests.faults

lua-test: sysdeps  ## Lua tap tests only (tests/lua/*_test.lua)
	@for t in tests/lua/*_test.lua; do \
		[ -e "$$t" ] || continue; \
		echo "== $$t"; tarantool "$$t" || exit 1; \
	done

# promtool, taken out of Debian's prometheus package into .venv/tools: installing the package would also
# enable and start a Prometheus server (on :9090) on a normal Debian host; this installs and starts nothing.
PROMTOOL := $(VENV)/tools/root/usr/bin/promtool

$(PROMTOOL):
	@echo "fetching promtool: Debian's prometheus package, unpacked into $(VENV)/tools (not installed)"
	@rm -rf $(VENV)/tools && mkdir -p $(VENV)/tools/deb
	@cd $(VENV)/tools/deb && { $(APT_GET) download -qq prometheus 2>/dev/null || \
		{ $(APT_GET) update -qq && $(APT_GET) download -qq prometheus; }; }
	@dpkg-deb -x $(VENV)/tools/deb/prometheus_*.deb $(VENV)/tools/root && rm -rf $(VENV)/tools/deb
	@test -x $@

lint: venv $(PROMTOOL)  ## ruff (check + format), import directions (import-linter; Lua requires; no import circle), mypy strict on service/, luacheck on lua/, the registry check, PROTOCOL.md tables vs the registry, promtool on the alert rules
	$(VENV)/bin/ruff check service tests loadtest
	$(VENV)/bin/ruff format --check service tests loadtest
	$(VENV)/bin/lint-imports
	$(VENV)/bin/mypy service/smartcache
	luacheck lua
	$(PY) -m pytest -q -p no:cacheprovider tests/unit/test_lua_layers.py tests/unit/test_import_cycles.py
	$(PY) -m pytest -q -p no:cacheprovider tests/unit/test_registry.py
	$(PY) -m pytest -q -p no:cacheprovider tests/unit/test_docs.py
	$(PY) -m smartcache.wire.gendoc --check
	$(PROMTOOL) check rules docker/prometheus/alerts.yml

fmt: venv  ## ruff format and autofix
	$(VENV)/bin/ruff format service tests loadtest
	$(VENV)/bin/ruff check --fix service tests loadtest

bench: venv  ## session scenario at W=1/16/128 with its ceilings (sketch, drained sketch, zmq echo), vs direct, CURVE, fsync, HA, one/two shards (about 5 min; var/bench.json)
	$(PY) -m loadtest bench

bench-resharding: venv  ## half of 1,000,000 sessions moved from one shard to a new one under the session load (about 8 min; var/resharding.json)
	$(PY) -m loadtest resharding

FUZZ_SECONDS ?= 600
fuzz: venv  ## coverage-guided fuzzing of the codec with atheris for FUZZ_SECONDS (600); corpus in tests/fuzz/corpus
	$(VENV)/bin/pip install -q --disable-pip-version-check -c constraints.txt -e '.[dev,fuzz]'
	$(PY) tests/fuzz/seed_corpus.py
	mkdir -p var/fuzz
	$(PY) tests/fuzz/fuzz_codec.py tests/fuzz/corpus -max_total_time=$(FUZZ_SECONDS) -print_final_stats=1 -artifact_prefix=var/fuzz/

docker-test: venv  ## images, the compose stack, end-to-end smoke suite, all torn down (KEEP_IMAGES=1 keeps images)
	bash docker/test.sh

reset-data:  ## wipe var/ (Tarantool data, logs, bench results), keep .venv; stop make run first
	rm -rf var

clean:  ## remove .venv, caches and var/
	rm -rf $(VENV) .pytest_cache .mypy_cache .ruff_cache .hypothesis var
	find . -name __pycache__ -type d -prune -exec rm -rf {} +
