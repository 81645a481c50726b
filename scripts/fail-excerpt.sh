#!/usr/bin/env bash
# fail-excerpt.sh LOG prints what CI's output needs to tell why a `go test -v` run in
# LOG failed (the matrix scripts keep each version's log on the machine, which CI's
# output does not show): every FAIL and panic line, subtests included, and the 25
# lines the test wrote before each failing leaf test's "--- FAIL" (its errors are
# among them, with its logs), 120 lines at most.
set -euo pipefail
awk '
	{ buf[NR % 25] = $0 }
	/^[ \t]*--- FAIL/ {
		if (!prevfail) {
			print "  (the 24 lines before it)"
			for (i = NR - 24; i < NR; i++) if (i > 0) print buf[i % 25]
		}
		print; prevfail = 1; next
	}
	/^(FAIL|panic:|dev: error)/ { print }
	{ prevfail = 0 }
' "$1" | head -n 120
