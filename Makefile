# The README's two commands: `make run` and `make test`. Both install missing
# Debian packages first (scripts/install-deps: what building and serving need;
# with --test, for the test targets, also what the tests use), then build
# with CMake.
BUILD      ?= build
ASAN_BUILD ?= build-asan
TSAN_BUILD ?= build-tsan
JOBS       ?= $(shell nproc)
PYTHON     ?= /usr/bin/python3
PREFIX     ?= /usr/local
CMAKE_FLAGS = -DCMAKE_BUILD_TYPE=RelWithDebInfo $(if $(KVP_WERROR),-DKVP_WERROR=ON)

.PHONY: all deps test-deps build asan tsan run install test unit install-test unit-asan unit-tsan \
        integration integration-redis integration-tsan python-test python-usrbio python-tsan \
        readme-test clean format format-check

all: build

deps:
	@scripts/install-deps

test-deps:
	@scripts/install-deps --test

build: deps
	@cmake -S . -B $(BUILD) $(CMAKE_FLAGS) >/dev/null
	@cmake --build $(BUILD) -j $(JOBS)

asan: deps
	@cmake -S . -B $(ASAN_BUILD) $(CMAKE_FLAGS) -DKVP_SANITIZE=ON >/dev/null
	@cmake --build $(ASAN_BUILD) -j $(JOBS)

# ThreadSanitizer build (its runtime cannot share a binary with ASan's).
tsan: deps
	@cmake -S . -B $(TSAN_BUILD) $(CMAKE_FLAGS) -DKVP_TSAN=ON >/dev/null
	@cmake --build $(TSAN_BUILD) -j $(JOBS)

# A ThreadSanitizer report stops the process at once with status 66 (a unit
# test fails; a server's stderr has the report, which the integration
# harness fails on). One suppression, built into kvpage (src/server/kvevents.c):
# races inside Debian's libzmq, whose lock-free queues TSan cannot see.
KVP_TSAN_OPTIONS = halt_on_error=1:exitcode=66:second_deadlock_stack=1

# Quiet on success: the build's output goes to $(BUILD)/build.log, shown
# (without make's directory lines and progress) only when the build fails;
# one line first says what the wait is ($@: run or install).
quiet-build = \
	echo "make $@: building kvpage in $(BUILD)/ (a minute or more the first time; its output: $(BUILD)/build.log)"; \
	cmake -S . -B $(BUILD) $(CMAKE_FLAGS) >/dev/null && \
	{ cmake --build $(BUILD) -j $(JOBS) >$(BUILD)/build.log 2>&1 || \
	  { grep -v -e 'make\[[0-9]*\]: \(Entering\|Leaving\) directory' -e '^\[ *[0-9]*%\]' \
	    $(BUILD)/build.log >&2; \
	    echo "make $@: the build failed (all of its output: $(BUILD)/build.log)" >&2; exit 1; }; }

run: deps
	@$(quiet-build)
	@echo "make run: starting $(BUILD)/kvpage serve $(ARGS)"
	@$(BUILD)/kvpage serve $(ARGS)

# Headers, libkvpage.so (with its SONAME links), kvpage.pc, the CMake package
# kvpage and bin/kvpage under $(PREFIX) (cmake --install says each file).
install: deps
	@$(quiet-build)
	@cmake --install $(BUILD) --prefix $(PREFIX)

unit: test-deps build
	@cd $(BUILD) && ctest --output-on-failure -j $(JOBS)

# Installs the release build into a temporary prefix and builds a C program
# (pkg-config) and a C++ program (find_package) against it.
install-test: test-deps build
	@tests/install/run.sh $(BUILD)

unit-asan: test-deps asan
	@cd $(ASAN_BUILD) && ctest --output-on-failure -j $(JOBS)

# Every unit test and fuzz replay under ThreadSanitizer (about 40 s on 2 cores).
unit-tsan: test-deps tsan
	@cd $(TSAN_BUILD) && TSAN_OPTIONS=$(KVP_TSAN_OPTIONS) ctest --output-on-failure -j $(JOBS)

# Integration tests drive the real binary: the release build (which has code
# that is compiled out under sanitizers, e.g. the request arena), then the
# sanitizer build.
integration: test-deps build asan
	@echo "integration tests: release build"
	@KVPAGE_BIN=$(CURDIR)/$(BUILD)/kvpage KVPAGE_LIB=$(CURDIR)/$(BUILD)/libkvpage.so \
	  $(PYTHON) -m pytest -q -p no:cacheprovider tests/integration
	@echo "integration tests: AddressSanitizer + UndefinedBehaviorSanitizer build"
	@KVPAGE_BIN=$(CURDIR)/$(ASAN_BUILD)/kvpage KVPAGE_LIB=$(CURDIR)/$(ASAN_BUILD)/libkvpage.so \
	  $(PYTHON) -m pytest -q -p no:cacheprovider tests/integration

# The same suite with every server's state in Redis (tests/integration/
# redisfix.py starts one redis-server on a free port; tests about the
# in-process backend's data directory are skipped), release and ASan builds.
# The ASan run leaves out the benches' CLI and the hostile clients (a minute
# of the suite's 20): their code is the same whatever the state's backend,
# and the in-process ASan run above has it.
REDIS_ASAN_SKIP = --ignore=tests/integration/test_cli_bench.py \
  --ignore=tests/integration/test_hostile.py
integration-redis: test-deps build asan
	@echo "integration tests, state in Redis: release build"
	@KVPAGE_TEST_BACKEND=redis KVPAGE_BIN=$(CURDIR)/$(BUILD)/kvpage \
	  KVPAGE_LIB=$(CURDIR)/$(BUILD)/libkvpage.so \
	  $(PYTHON) -m pytest -q -p no:cacheprovider tests/integration
	@echo "integration tests, state in Redis: AddressSanitizer + UndefinedBehaviorSanitizer build"
	@KVPAGE_TEST_BACKEND=redis KVPAGE_BIN=$(CURDIR)/$(ASAN_BUILD)/kvpage \
	  KVPAGE_LIB=$(CURDIR)/$(ASAN_BUILD)/libkvpage.so \
	  $(PYTHON) -m pytest -q -p no:cacheprovider tests/integration $(REDIS_ASAN_SKIP)

# The integration tests in which the server runs threads against each other
# (HTTP workers, the log's flusher and parked replies, snapshots, the body
# worker and the connection counters; bench trace's connections), against
# the ThreadSanitizer build.
TSAN_INTEGRATION = tests/integration/test_concurrency.py tests/integration/test_crash.py \
  tests/integration/test_kv_events.py tests/integration/test_events_lineage.py \
  tests/integration/test_hostile.py::test_probe_while_hostile \
  tests/integration/test_hostile.py::test_big_valid_request_off_the_loop \
  tests/integration/test_hostile.py::test_body_memory_budget \
  tests/integration/test_store_remote.py tests/integration/test_redis.py \
  tests/integration/test_sentinel.py tests/integration/test_bench_trace.py::test_several_connections \
  tests/integration/test_bench_trace.py::test_events_rebuild_the_inventory
integration-tsan: test-deps tsan
	@echo "integration tests: ThreadSanitizer build ($(notdir $(TSAN_INTEGRATION)))"
	@TSAN_OPTIONS=$(KVP_TSAN_OPTIONS) \
	  KVPAGE_BIN=$(CURDIR)/$(TSAN_BUILD)/kvpage KVPAGE_LIB=$(CURDIR)/$(TSAN_BUILD)/libkvpage.so \
	  $(PYTHON) -m pytest -q -p no:cacheprovider $(TSAN_INTEGRATION)

# The Python package (python/kvpage) against the build tree's library, then
# against the ASan one (the sanitizer runtime preloaded into Python; Python's
# own allocations are not leak-checked). tests/python/test_install.py also
# pip-installs the package into a venv (release run only).
ASAN_RT = $(shell gcc -print-file-name=libasan.so)
python-test: test-deps build asan
	@echo "python tests: release build"
	@KVPAGE_BIN=$(CURDIR)/$(BUILD)/kvpage KVPAGE_LIB=$(CURDIR)/$(BUILD)/libkvpage.so \
	  $(PYTHON) -m pytest -q -p no:cacheprovider tests/python
	@echo "python tests: AddressSanitizer + UndefinedBehaviorSanitizer build"
	@LD_PRELOAD=$(ASAN_RT) ASAN_OPTIONS=detect_leaks=0 \
	  KVPAGE_BIN=$(CURDIR)/$(ASAN_BUILD)/kvpage KVPAGE_LIB=$(CURDIR)/$(ASAN_BUILD)/libkvpage.so \
	  $(PYTHON) -m pytest -q -p no:cacheprovider tests/python
	@$(MAKE) --no-print-directory python-usrbio

# The Python tests (but the install's) with every test's directory an
# emulated 3FS mount (tests/usrbio_emu), so that PageFile, Store,
# compat.Hf3fsClient and the engines' modules run over the USRBIO backend;
# release and sanitizer builds.
python-usrbio: test-deps build asan
	@echo "python tests over the USRBIO emulation: release build"
	@KVPAGE_TEST_USRBIO=1 KVPAGE_BIN=$(CURDIR)/$(BUILD)/kvpage \
	  KVPAGE_LIB=$(CURDIR)/$(BUILD)/libkvpage.so \
	  $(PYTHON) -m pytest -q -p no:cacheprovider tests/python --deselect tests/python/test_install.py
	@echo "python tests over the USRBIO emulation: AddressSanitizer + UndefinedBehaviorSanitizer build"
	@LD_PRELOAD=$(ASAN_RT) ASAN_OPTIONS=detect_leaks=0 KVPAGE_TEST_USRBIO=1 \
	  KVPAGE_BIN=$(CURDIR)/$(ASAN_BUILD)/kvpage KVPAGE_LIB=$(CURDIR)/$(ASAN_BUILD)/libkvpage.so \
	  $(PYTHON) -m pytest -q -p no:cacheprovider tests/python --deselect tests/python/test_install.py

# The Python tests again against the TSan library, its runtime preloaded into
# Python: races between the library's threads and Python's callers (many
# threads on one client, close while calls run). Python's own code is not
# instrumented; its GIL and locks are pthreads, which TSan sees.
TSAN_RT = $(shell gcc -print-file-name=libtsan.so)
python-tsan: test-deps tsan
	@echo "python tests: ThreadSanitizer build"
	@LD_PRELOAD=$(TSAN_RT) TSAN_OPTIONS=$(KVP_TSAN_OPTIONS) \
	  KVPAGE_BIN=$(CURDIR)/$(TSAN_BUILD)/kvpage KVPAGE_LIB=$(CURDIR)/$(TSAN_BUILD)/libkvpage.so \
	  $(PYTHON) -m pytest -q -p no:cacheprovider tests/python

# Every fenced block of README.md run or checked as a new user would run it
# (tests/readme: its markers say how), against the release build.
readme-test: test-deps build
	@echo "README blocks: release build"
	@KVPAGE_BIN=$(CURDIR)/$(BUILD)/kvpage KVPAGE_LIB=$(CURDIR)/$(BUILD)/libkvpage.so \
	  $(PYTHON) -m pytest -q -p no:cacheprovider tests/readme

test: test-deps unit install-test unit-asan integration integration-redis python-test readme-test \
      unit-tsan integration-tsan python-tsan

clean:
	rm -rf $(BUILD) $(ASAN_BUILD) $(TSAN_BUILD)

format: test-deps
	clang-format -i $$(git ls-files '*.c' '*.h' '*.cpp')

# Fails when a C file is not formatted as .clang-format says (.ci/run runs it).
format-check: test-deps
	@scripts/check-format
