#!/usr/bin/env bash
# flashsample same-run comparison, written by `cargo xtask ab-bundle`. Runs
# on a machine with an NVIDIA GPU and driver; needs no Rust toolchain.
#
#   ./run-ab [tests] [sanitize] [bench]     (default: all three, in that order)
#
# tests     every test executable of each revision but the first (the base)
# sanitize  their sanitize_ tests under memcheck and racecheck
# bench     every revision's benches in turn, base first, FLASHSAMPLE_AB_REPS
#           times (default 2); FLASHSAMPLE_BENCH_ONLY passes through
#
# Logs go to $OUT, or to out/ next to this script when OUT is unset:
#   <rev>_<test>.log  <rev>_san_<tool>.log  <rev>_<bench>_<rep>.log  summary.txt
# FLASHSAMPLE_STEP_TIMEOUT bounds each command (seconds, default 300).
set -uo pipefail

REVS=(@REVS@)
TESTS=(@TESTS@)
BENCHES=(@BENCHES@)

steps=()
for arg in "$@"; do
    case "$arg" in
        tests | sanitize | bench) steps+=("$arg") ;;
        *)
            echo "usage: $0 [tests] [sanitize] [bench]" >&2
            exit 2
            ;;
    esac
done
[ ${#steps[@]} -eq 0 ] && steps=(tests sanitize bench)

@PRELUDE@
REPS="${FLASHSAMPLE_AB_REPS:-2}"
T0=$(date +%s)

# note LINE: appends LINE, with the seconds since the start, to summary.txt.
note() {
    echo "[$(($(date +%s) - T0))s] $*" | tee -a "$OUT/summary.txt"
}

# step LOG COMMAND...: runs COMMAND under the step timeout into LOG.
step() {
    local log="$1"
    shift
    timeout --kill-after=10 "$STEP_TIMEOUT" "$@" >"$log" 2>&1
    local rc=$?
    note "rc=$rc $*"
    return "$rc"
}

san="$(command -v compute-sanitizer || echo /usr/local/cuda/bin/compute-sanitizer)"
for s in "${steps[@]}"; do
    for rev in "${REVS[@]:1}"; do
        for t in "${TESTS[@]}"; do
            [ -x "$rev/$t" ] || continue
            case "$s" in
                tests) step "$OUT/${rev}_$t.log" "$rev/$t" --test-threads=1 ;;
                sanitize)
                    # Each sanitize_ test in its own process, under each tool
                    # of FLASHSAMPLE_SANITIZE_TOOLS (default memcheck and
                    # racecheck), so a slow one costs only its own result.
                    for name in $("$rev/$t" --list sanitize_ 2>/dev/null | sed -n 's/: test$//p'); do
                        for tool in ${FLASHSAMPLE_SANITIZE_TOOLS:-memcheck racecheck}; do
                            step "$OUT/${rev}_${name}_san_$tool.log" "$san" --tool "$tool" \
                                --error-exitcode 1 "$rev/$t" --exact "$name"
                        done
                    done
                    ;;
            esac
        done
    done
    if [ "$s" = bench ]; then
        for rep in $(seq 1 "$REPS"); do
            for rev in "${REVS[@]}"; do
                for b in "${BENCHES[@]}"; do
                    [ -x "$rev/$b" ] && step "$OUT/${rev}_${b}_$rep.log" "$rev/$b"
                done
            done
        done
    fi
done
grep -h "test result" "$OUT"/*.log 2>/dev/null | sort | uniq -c
grep -hE "ERROR SUMMARY|RACECHECK SUMMARY" "$OUT"/*_san_*.log 2>/dev/null
cat "$OUT/summary.txt"
