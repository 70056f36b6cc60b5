#!/usr/bin/env bash
# hot_text_fits.sh: what cmake/hot-text.ld says a program that only calls
# the allocator runs (its parts 1 and 2) ends within the library's
# first 64 KiB, the kernel's fault-around window.
#
# usage: hot_text_fits.sh LIBCORALLOC_SO
#
# The linker script marks that end with the hidden symbol
# coral_hot_text_fits_end. The probe (ctest hot_text) finds a program
# thread's touch past the window every time, but a touch by the purge
# thread only when the purger happens to run that code during the probe's
# short life (it blocks every signal: the process dies then): this check
# does not depend on timing. It prints the room left.
set -u
LIB=${1:?libcoralloc.so path}
WINDOW=$((64 * 1024))
line=$(nm "$LIB" | awk '$3 == "coral_hot_text_fits_end" { print $1 }')
if [ -z "$line" ]; then
    echo "hot_text_fits: no coral_hot_text_fits_end in $LIB (linked without cmake/hot-text.ld?)" >&2
    exit 1
fi
end=$((16#$line))
if [ "$end" -gt "$WINDOW" ]; then
    echo "hot_text_fits: FAILED: parts 1 and 2 end at $(printf 0x%x "$end"), $((end - WINDOW)) bytes past the first 64 KiB" >&2
    exit 1
fi
echo "hot_text_fits: parts 1 and 2 end at $(printf 0x%x "$end"): $((WINDOW - end)) bytes left in the first 64 KiB"
