# Top-level driver. `make` builds build/libcoralloc.{so,a}; `make test` builds
# the normal, ASan+UBSan (with per-class statistics compiled in, so their
# tests run too) and TSan configurations and runs every test through ctest;
# `make bench` runs the default benchmark comparison.
JOBS ?= $(shell nproc 2>/dev/null || echo 2)
CMAKE ?= cmake

.PHONY: all build test test-release test-asan test-tsan bench clean format

all: build

build:
	$(CMAKE) -S . -B build -DCMAKE_BUILD_TYPE=Release >/dev/null
	$(CMAKE) --build build -j$(JOBS)

build-asan/.configured:
	$(CMAKE) -S . -B build-asan -DCMAKE_BUILD_TYPE=RelWithDebInfo -DCORAL_SANITIZE=address -DCORAL_STATS=ON >/dev/null
	touch $@

build-tsan/.configured:
	$(CMAKE) -S . -B build-tsan -DCMAKE_BUILD_TYPE=RelWithDebInfo -DCORAL_SANITIZE=thread >/dev/null
	touch $@

test-release: build
	cd build && ctest --output-on-failure -j$(JOBS)

test-asan: build-asan/.configured
	$(CMAKE) --build build-asan -j$(JOBS)
	cd build-asan && ctest --output-on-failure -j$(JOBS)

test-tsan: build-tsan/.configured
	$(CMAKE) --build build-tsan -j$(JOBS)
	cd build-tsan && ctest --output-on-failure -j$(JOBS)

# One summary line per configuration, then the overall one.
test: test-release test-asan test-tsan
	@echo "all configurations passed: release, asan+ubsan, tsan"

bench: build
	./bench/run-bench

format:
	find include src tests bench/workloads bench/witness bench/src/coralloc_bench/data -name '*.c' -o -name '*.h' -o -name '*.cc' | xargs clang-format -i

clean:
	rm -rf build build-asan build-tsan
