# The README's two commands: `make run` and `make test`. Both install missing
# Debian packages first (scripts/install-deps), then build with CMake.
BUILD      ?= build
ASAN_BUILD ?= build-asan
JOBS       ?= $(shell nproc)
PYTHON     ?= /usr/bin/python3
CMAKE_FLAGS = -DCMAKE_BUILD_TYPE=RelWithDebInfo $(if $(KVP_WERROR),-DKVP_WERROR=ON)

.PHONY: all deps build asan run test unit unit-asan integration clean format

all: build

deps:
	@scripts/install-deps

build: deps
	@cmake -S . -B $(BUILD) $(CMAKE_FLAGS) >/dev/null
	@cmake --build $(BUILD) -j $(JOBS)

asan: deps
	@cmake -S . -B $(ASAN_BUILD) $(CMAKE_FLAGS) -DKVP_SANITIZE=ON >/dev/null
	@cmake --build $(ASAN_BUILD) -j $(JOBS)

run: build
	@$(BUILD)/kvpage serve $(ARGS)

unit: build
	@cd $(BUILD) && ctest --output-on-failure -j $(JOBS)

unit-asan: asan
	@cd $(ASAN_BUILD) && ctest --output-on-failure -j $(JOBS)

# Integration tests drive the real binary: the release build (which has code
# that is compiled out under sanitizers, e.g. the request arena), then the
# sanitizer build.
integration: build asan
	@echo "integration tests: release build"
	@KVPAGE_BIN=$(CURDIR)/$(BUILD)/kvpage KVPAGE_LIB=$(CURDIR)/$(BUILD)/libkvpage.so \
	  $(PYTHON) -m pytest -q -p no:cacheprovider tests/integration
	@echo "integration tests: AddressSanitizer + UndefinedBehaviorSanitizer build"
	@KVPAGE_BIN=$(CURDIR)/$(ASAN_BUILD)/kvpage KVPAGE_LIB=$(CURDIR)/$(ASAN_BUILD)/libkvpage.so \
	  $(PYTHON) -m pytest -q -p no:cacheprovider tests/integration

test: unit unit-asan integration

clean:
	rm -rf $(BUILD) $(ASAN_BUILD)

format:
	clang-format -i $$(git ls-files '*.c' '*.h')
