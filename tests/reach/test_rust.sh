#!/usr/bin/env bash
# test_rust.sh test|clippy CRATE_DIR TARGET_DIR: the Rust crate's tests
# (`cargo test`, which includes the #[global_allocator] test binaries and the
# doctests of its README and the repository's README) or its lints
# (`cargo clippy --all-targets -- -D warnings`).
# Exit 77 (skipped) when cargo (or clippy) is missing, or when crates.io is
# out of reach and the crates in Cargo.lock are not already fetched.
set -u
WHAT=${1:?test or clippy}
CRATE=${2:?crate dir}
export CARGO_TARGET_DIR=${3:?target dir}
SKIP=77
cd "$CRATE" || exit 1
command -v cargo >/dev/null 2>&1 || { echo "SKIP: cargo is not installed"; exit $SKIP; }
if [ "$WHAT" = clippy ] && ! cargo clippy --version >/dev/null 2>&1; then
    echo "SKIP: cargo clippy is not installed"
    exit $SKIP
fi
if ! cargo fetch --locked >/tmp/coral_cargo_fetch.$$ 2>&1; then
    if ! cargo fetch --locked --offline >/dev/null 2>&1; then
        echo "SKIP: crates.io is out of reach and the crates are not fetched:"
        tail -n 3 /tmp/coral_cargo_fetch.$$
        rm -f /tmp/coral_cargo_fetch.$$
        exit $SKIP
    fi
fi
rm -f /tmp/coral_cargo_fetch.$$
case $WHAT in
test) exec cargo test --locked --offline ;;
clippy) exec cargo clippy --locked --offline --all-targets -- -D warnings ;;
*) echo "unknown: $WHAT" >&2; exit 1 ;;
esac
