#!/usr/bin/env bash
# run_if_tool.sh TOOL COMMAND...: run COMMAND when TOOL is installed; else
# say so and exit 77, which ctest reports as SKIPPED (SKIP_RETURN_CODE).
tool=$1
shift
if ! command -v "$tool" >/dev/null 2>&1; then
    echo "SKIPPED: $tool is not installed"
    exit 77
fi
exec "$@"
