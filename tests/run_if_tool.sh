#!/usr/bin/env bash
# run_if_tool.sh TOOL COMMAND...: run COMMAND when TOOL is installed; else
# say so, naming the Debian package that has it (tests/deps.sh skipped), and
# exit 77, which ctest reports as SKIPPED (SKIP_RETURN_CODE).
tool=$1
shift
"$(dirname "$0")/deps.sh" skipped "$tool" || exit $?
exec "$@"
