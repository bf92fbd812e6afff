#!/usr/bin/env bash
# flashsample same-run comparison, written by `cargo xtask ab-bundle`. Runs
# on a machine with an NVIDIA GPU and driver; needs no Rust toolchain.
#
#   ./run-ab [tests] [sanitize] [bench] [profile]
#                       (default: the first three, in that order)
#
# tests     every test executable of each revision but the first (the base);
#           FLASHSAMPLE_AB_TEST_ARGS_<test> (e.g. FLASHSAMPLE_AB_TEST_ARGS_gpu=fused)
#           adds arguments (a name filter) to that executable's runs
# sanitize  their sanitize_ tests under memcheck and racecheck; the tests
#           listed are those whose name contains FLASHSAMPLE_SANITIZE_ONLY
#           (default sanitize_)
# bench     every revision's benches in turn, base first, FLASHSAMPLE_AB_REPS
#           times (default 2); FLASHSAMPLE_BENCH_ONLY passes through;
#           FLASHSAMPLE_AB_BENCH_SPLIT, texts separated by ';', runs each
#           bench once per text (one process each, the text as
#           FLASHSAMPLE_BENCH_ONLY) instead
# profile   Nsight Compute on every revision's benches: the first launch of
#           the kernels matching the regular expression FLASHSAMPLE_NCU_KERNEL
#           (required) in the cases FLASHSAMPLE_BENCH_ONLY selects, full
#           section set with source counters, FLASHSAMPLE_NCU_ARGS added
#
# Logs go to $OUT, or to out/ next to this script when OUT is unset:
#   <rev>_<test>.log  <rev>_<test>_<sanitize test>_san_<tool>.log
#   <rev>_<bench>_<rep>[_<n>].log
#   <rev>_<bench>.ncu-rep and its details page <rev>_<bench>_ncu.txt
#   summary.txt; at the end all of them but summary.txt go into logs.tgz
#   and leave $OUT (the way back from the device machine takes only a few
#   files, and would drop logs.tgz itself behind many logs)
# FLASHSAMPLE_STEP_TIMEOUT bounds each command (seconds, default 300).
set -uo pipefail

REVS=(@REVS@)
TESTS=(@TESTS@)
BENCHES=(@BENCHES@)

steps=()
for arg in "$@"; do
    case "$arg" in
        tests | sanitize | bench | profile) steps+=("$arg") ;;
        *)
            echo "usage: $0 [tests] [sanitize] [bench] [profile]" >&2
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
ncu="$(command -v ncu || echo /usr/local/cuda/bin/ncu)"
if [[ " ${steps[*]} " == *" profile "* && -z "${FLASHSAMPLE_NCU_KERNEL:-}" ]]; then
    echo "profile needs FLASHSAMPLE_NCU_KERNEL (a regular expression of kernel names)" >&2
    exit 2
fi
for s in "${steps[@]}"; do
    for rev in "${REVS[@]:1}"; do
        for t in "${TESTS[@]}"; do
            [ -x "$rev/$t" ] || continue
            case "$s" in
                tests)
                    args_var="FLASHSAMPLE_AB_TEST_ARGS_$t"
                    # shellcheck disable=SC2086 # the arguments split on spaces
                    step "$OUT/${rev}_$t.log" "$rev/$t" --test-threads=1 ${!args_var:-}
                    ;;
                sanitize)
                    # Each sanitize_ test in its own process, under each tool
                    # of FLASHSAMPLE_SANITIZE_TOOLS (default memcheck and
                    # racecheck), so a slow one costs only its own result.
                    only="${FLASHSAMPLE_SANITIZE_ONLY:-sanitize_}"
                    for name in $("$rev/$t" --list "$only" 2>/dev/null | sed -n 's/: test$//p' | grep sanitize_); do
                        for tool in ${FLASHSAMPLE_SANITIZE_TOOLS:-memcheck racecheck}; do
                            step "$OUT/${rev}_${t}_${name}_san_$tool.log" "$san" --tool "$tool" \
                                --error-exitcode 1 "$rev/$t" --exact "$name"
                        done
                    done
                    ;;
            esac
        done
    done
    if [ "$s" = bench ]; then
        IFS=';' read -ra splits <<<"${FLASHSAMPLE_AB_BENCH_SPLIT:-}"
        for rep in $(seq 1 "$REPS"); do
            for rev in "${REVS[@]}"; do
                for b in "${BENCHES[@]}"; do
                    [ -x "$rev/$b" ] || continue
                    if [ ${#splits[@]} -eq 0 ]; then
                        step "$OUT/${rev}_${b}_$rep.log" "$rev/$b"
                        continue
                    fi
                    n=0
                    for only in "${splits[@]}"; do
                        n=$((n + 1))
                        FLASHSAMPLE_BENCH_ONLY="$only" \
                            step "$OUT/${rev}_${b}_${rep}_$n.log" "$rev/$b"
                    done
                done
            done
        done
    fi
    if [ "$s" = profile ]; then
        for rev in "${REVS[@]}"; do
            for b in "${BENCHES[@]}"; do
                [ -x "$rev/$b" ] || continue
                rep_file="$OUT/${rev}_$b"
                # shellcheck disable=SC2086 # the arguments split on spaces
                step "$OUT/${rev}_${b}_ncu.log" "$ncu" -k "regex:$FLASHSAMPLE_NCU_KERNEL" -c 1 \
                    --set full --import-source yes -f -o "$rep_file" ${FLASHSAMPLE_NCU_ARGS:-} "$rev/$b" &&
                    "$ncu" --import "$rep_file.ncu-rep" --page details >"$OUT/${rev}_${b}_ncu.txt" 2>&1
            done
        done
    fi
done
grep -h "test result" "$OUT"/*.log 2>/dev/null | sort | uniq -c
grep -hE "ERROR SUMMARY|RACECHECK SUMMARY" "$OUT"/*_san_*.log 2>/dev/null
cat "$OUT/summary.txt"
(cd "$OUT" && tar czf logs.tgz --exclude=logs.tgz --exclude=summary.txt -- * &&
    find . -mindepth 1 -maxdepth 1 ! -name logs.tgz ! -name summary.txt -exec rm -rf -- {} +)
