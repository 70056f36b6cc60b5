# Top-level driver. `make` builds build/libcoralloc.{so,a}; `make test` builds
# the normal, ASan+UBSan (with per-class statistics compiled in, so their
# tests run too) and TSan configurations and runs every test through ctest;
# `make bench` runs the default benchmark comparison. The test targets first
# install what their tests need (test-deps).
JOBS ?= $(shell nproc 2>/dev/null || echo 2)
CMAKE ?= cmake

PREFIX ?= /usr/local

.PHONY: all build test test-deps test-release test-asan test-tsan test-arm64 test-programs bench \
	clean format install uninstall deb fuzz

all: build

build:
	$(CMAKE) -S . -B build -DCMAKE_BUILD_TYPE=Release >/dev/null
	$(CMAKE) --build build -j$(JOBS)

# The Debian packages the tests need (tests/packages.txt, the list .ci/run
# installs from too): apt-get installs the missing ones when root; a user
# who is not root is told which, and their tests report SKIPPED naming the
# package. One dpkg-query when all are there. CORALLOC_NO_INSTALL=1: never
# installs. Every test target runs it before it configures or builds.
test-deps:
	@tests/deps.sh install

build-asan/.configured: | test-deps
	$(CMAKE) -S . -B build-asan -DCMAKE_BUILD_TYPE=RelWithDebInfo -DCORAL_SANITIZE=address -DCORAL_STATS=ON >/dev/null
	touch $@

build-tsan/.configured: | test-deps
	$(CMAKE) -S . -B build-tsan -DCMAKE_BUILD_TYPE=RelWithDebInfo -DCORAL_SANITIZE=thread >/dev/null
	touch $@

test-release: test-deps
	@$(MAKE) --no-print-directory build
	cd build && ctest --output-on-failure -j$(JOBS)

test-asan: build-asan/.configured
	$(CMAKE) --build build-asan -j$(JOBS)
	cd build-asan && ctest --output-on-failure -j$(JOBS)

test-tsan: build-tsan/.configured
	$(CMAKE) --build build-tsan -j$(JOBS)
	cd build-tsan && ctest --output-on-failure -j$(JOBS)

# Real programs from Debian (python3's tests, sqlite3, redis, git, g++) under
# LD_PRELOAD of every coralloc library, against their runs without it
# (tests/programs/run_programs.py); also part of test-release.
test-programs: test-deps
	@$(MAKE) --no-print-directory build
	cd build && ctest --output-on-failure -j$(JOBS) -R '^programs_'

# One summary line per configuration, then the overall one.
test: test-release test-asan test-tsan
	@echo "all configurations passed: release, asan+ubsan, tsan"

# Install to $(PREFIX) (and $(DESTDIR)); the list of installed files is kept
# in build/install_manifest.make.txt for `make uninstall`.
install: build
	$(CMAKE) --install build --prefix $(PREFIX)
	cp build/install_manifest.txt build/install_manifest.make.txt

uninstall:
	@test -f build/install_manifest.make.txt || { echo "make uninstall: nothing installed by make install from this build"; exit 1; }
	xargs -d '\n' rm -f -- < build/install_manifest.make.txt
	rm -f build/install_manifest.make.txt

# Debian package: build/coralloc_<version>_<arch>.deb (apt-get install ./build/coralloc_*.deb).
deb: build
	cd build && cpack -G DEB

# Linux arm64: cross-built with gcc-aarch64-linux-gnu, the release test
# configuration run under qemu-user (without binfmt_misc: the arm64 programs
# cannot exec each other). Left out, for what qemu-user cannot do, not for
# anything coralloc does: tests that re-exec themselves (/proc/self/exe) or
# run death tests in children (errors, faults, heaps, stats, stats_override,
# purge, populate, reclaim) or run the build's programs from host tools
# (bench_runner, preload_*, programs_*, valgrind_*, misuse, misuse_secure, misuse_doc,
# startup_cost, hot_text, glibc_malloc_tests: LD_PRELOAD of an arm64 library into host programs; options_setuid:
# setpriv runs it); tests that fork a
# multi-threaded process (fork, fork_override, fork_profile_lib_sampled, fork_storm, fork_early_*, window_fork_*,
# lifetime_*: qemu 7.2 asserts in the child, "cpu == current_cpu" or in its
# plugin's vcpu init; window_purger_watch_expired and
# window_purger_started_notice end a fork child through its purge thread as
# lifetime_* do: under qemu the child's notice is never seen and it is
# killed after 30 s); churn and lifetime_key_destructor_rounds (their
# RSS/VmSize bounds would count qemu's own translation cache); the profile
# tests that run host programs on the build's files (profile_accuracy,
# profile_accuracy_small, profile_accuracy_profile_lib, profile_pprof,
# profile_report, profile_stray_frame). Left out for time only: fuzz_secure (fuzz,
# the same program against the default build, runs). See docs/PLATFORMS.md.
ARM64_EXCLUDE = ^(preload_.*|programs_.*|valgrind_.*|bench_runner|misuse|misuse_secure|misuse_doc|fuzz_secure|errors|faults|heaps|stats|stats_override|purge|populate|reclaim|fork|fork_override|fork_profile_lib_sampled|fork_storm|fork_early_.*|churn|startup_cost|hot_text|options_setuid|glibc_malloc_tests|glibc_malloc_tests_secure|window_fork_.*|window_purger_watch_expired|window_purger_started_notice|lifetime_.*|profile_accuracy|profile_accuracy_small|profile_accuracy_profile_lib|profile_pprof|profile_report|profile_stray_frame|profile_thread_totals)$$
build-arm64/.configured: | test-deps
	$(CMAKE) -S . -B build-arm64 -DCMAKE_BUILD_TYPE=Release -DCORAL_SKIP_RUST=ON \
		-DCMAKE_TOOLCHAIN_FILE=cmake/aarch64-toolchain.cmake >/dev/null
	touch $@

test-arm64: build-arm64/.configured
	$(CMAKE) --build build-arm64 -j$(JOBS)
	cd build-arm64 && ctest --output-on-failure -j$(JOBS) -E '$(ARM64_EXCLUDE)'

bench: build
	./bench/run-bench

# The libFuzzer targets (docs/FUZZING.md), built with clang in build-fuzz:
# the model fuzzer for FUZZ_SECONDS, then the option parser's for
# FUZZ_OPTIONS_SECONDS, each growing its corpus in build-fuzz/corpus/.
FUZZ_SECONDS ?= 60
FUZZ_OPTIONS_SECONDS ?= 10
fuzz: test-deps
	tests/fuzz/run_fuzz.sh build build-fuzz
	tests/fuzz/run_fuzz.sh run build-fuzz fuzz_model $(FUZZ_SECONDS)
	tests/fuzz/run_fuzz.sh run build-fuzz fuzz_options $(FUZZ_OPTIONS_SECONDS)

format:
	find include src tests bench/workloads bench/witness bench/src/coralloc_bench/data -name '*.c' -o -name '*.h' -o -name '*.cc' | xargs clang-format -i

clean:
	rm -rf build build-asan build-tsan build-arm64 build-fuzz
