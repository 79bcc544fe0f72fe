#!/usr/bin/env python3
"""Adds up the results of meson test runs into one line "N passed, N failed".

A Criterion executable counts its test cases (from its "Synthesis" line);
any other test counts as one. A test whose executable failed without a
synthesis line (a crash, a timeout) counts as one failure.
"""
import json
import os
import re
import sys

SANITIZER_MARKS = ("ERROR: LeakSanitizer", "ERROR: AddressSanitizer", "runtime error:")
SYNTHESIS = re.compile(r"Synthesis: Tested: (\d+) \| Passing: (\d+) \| Failing: (\d+) \| Crashing: (\d+)")


def count(build_dir):
    passed = failed = skipped = 0
    path = os.path.join(build_dir, "meson-logs", "testlog.json")
    if not os.path.exists(path):
        print(f"{build_dir}: no test log (the build failed?)", file=sys.stderr)
        return 0, 1, 0
    with open(path) as f:
        for line in f:
            t = json.loads(line)
            out = (t.get("stdout") or "") + (t.get("stderr") or "")
            m = SYNTHESIS.findall(out)
            if t.get("result") == "SKIP":
                skipped += 1  # the test printed why
                continue
            ok = t.get("result") in ("OK", "EXPECTEDFAIL")
            # Criterion's workers may exit after a passing case with a
            # sanitizer report that does not fail the run: count it here.
            sanitizer = any(s in out for s in SANITIZER_MARKS)
            if m:
                _, p, fl, cr = map(int, m[-1])
                passed += p
                failed += fl + cr
                if (not ok or sanitizer) and fl + cr == 0:
                    failed += 1  # e.g. a leak report after every case passed
            elif ok and not sanitizer:
                passed += 1
            else:
                failed += 1
    return passed, failed, skipped


def main():
    total_p = total_f = total_s = 0
    for d in sys.argv[1:]:
        p, f, s = count(d)
        print(f"{d}: {p} passed, {f} failed, {s} skipped")
        total_p += p
        total_f += f
        total_s += s
    print(f"{total_p} passed, {total_f} failed" + (f", {total_s} skipped" if total_s else ""))
    return 1 if total_f else 0


if __name__ == "__main__":
    sys.exit(main())
