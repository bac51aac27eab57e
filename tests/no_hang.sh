#!/bin/sh
# tests/no_hang.sh SECONDS CMD...: runs CMD under a watchdog; fails (1) only when CMD was still
# running after SECONDS (a host that never came back), whatever CMD's own exit code.
t=$1; shift
timeout "$t" "$@" > /dev/null 2>&1
rc=$?
if [ $rc -eq 124 ] || [ $rc -eq 137 ]; then echo "no_hang: still running after $t s: $*"; echo "no_hang: 0 passed, 1 failed"; exit 1; fi
echo "no_hang: came back (exit $rc): $*"
echo "no_hang: 1 passed, 0 failed"
exit 0
