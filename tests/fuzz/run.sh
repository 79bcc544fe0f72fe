#!/bin/sh
# Bounded fuzz run for CI: builds every harness, then runs each one for
# SECONDS seconds (default 60) on a copy of its checked-in corpus.
#   tests/fuzz/run.sh [SECONDS]
# Prints one line per target, "PASS fuzz_npy: N runs" or "FAIL fuzz_npy:
# ..." and exits 1 when any target found a crash, a leak, a timeout (an
# input taking more than 10 s) or a sanitizer report. The failing input is
# kept and its path printed: add it to corpus/<target>/ once fixed.
# Exits 77 (meson's "skipped") when clang or its libFuzzer runtime is absent
# (Debian: apt-get install clang libclang-rt-14-dev).
# Environment: FUZZ_BUILD_DIR reuses a build directory (default: a temporary
# one); FUZZ_TARGETS limits the run ("npy config"); FUZZ_SECONDS, when set,
# overrides SECONDS (tests/run sets it, 10 by default and in CI).
set -u
here=$(cd "$(dirname "$0")" && pwd -P)
seconds=${FUZZ_SECONDS:-${1:-60}}
case $seconds in
  '' | *[!0-9]*) echo "usage: run.sh [SECONDS]" >&2; exit 2 ;;
esac

if ! command -v "${CC:-clang}" >/dev/null 2>&1; then
  echo "SKIP fuzz: clang not found (apt-get install clang libclang-rt-14-dev)"
  exit 77
fi
probe=$(mktemp -d)
printf 'int LLVMFuzzerTestOneInput(const char *d, unsigned long n) { (void)d; (void)n; return 0; }\n' \
  > "$probe/p.c"
if ! "${CC:-clang}" -fsanitize=fuzzer "$probe/p.c" -o "$probe/p" 2>/dev/null; then
  rm -rf "$probe"
  echo "SKIP fuzz: clang has no libFuzzer runtime (apt-get install libclang-rt-14-dev)"
  exit 77
fi
rm -rf "$probe"

work=$(mktemp -d "${TMPDIR:-/tmp}/distd-fuzz.XXXXXX")
build=${FUZZ_BUILD_DIR:-$work/build}
if ! "$here/build.sh" "$build" > "$work/build.log" 2>&1; then
  cat "$work/build.log"
  echo "FAIL build: the harnesses did not compile (log above)"
  exit 1
fi

targets=${FUZZ_TARGETS:-$(cd "$here/corpus" && ls)}
failed=0
for t in $targets; do
  name=fuzz_$t
  corpus=$work/corpus/$t
  mkdir -p "$corpus" "$work/artifacts/$t"
  cp "$here/corpus/$t"/* "$corpus"/
  dict=""
  [ -f "$here/dict/$t.dict" ] && dict="-dict=$here/dict/$t.dict"
  log=$work/$name.log
  # -timeout: one input may take 10 s (a hang otherwise); -rss_limit_mb
  # catches runaway allocations; leaks are reported by ASan at each input.
  ASAN_OPTIONS=detect_leaks=1:allocator_may_return_null=1 \
  UBSAN_OPTIONS=print_stacktrace=1:halt_on_error=1 \
    "$build/$name" -max_total_time="$seconds" -timeout=10 -rss_limit_mb=2048 \
      -print_final_stats=1 -artifact_prefix="$work/artifacts/$t/" $dict \
      "$corpus" > "$log" 2>&1
  rc=$?
  runs=$(sed -n 's/^stat::number_of_executed_units: *//p' "$log" | tail -n 1)
  artifact=$(ls "$work/artifacts/$t" 2>/dev/null | head -n 1)
  if [ $rc -eq 0 ] && [ -z "$artifact" ]; then
    echo "PASS $name: ${runs:-0} runs"
  else
    failed=1
    grep -E 'ERROR|SUMMARY|property failed|runtime error' "$log" | head -n 5 | sed 's/^/  /'
    echo "FAIL $name: exit $rc after ${runs:-?} runs;" \
      "input $work/artifacts/$t/${artifact:-?}, log $log"
  fi
done

# Keep the evidence of a failure; otherwise clean up.
[ $failed -eq 0 ] && rm -rf "$work"
exit $failed
