#!/usr/bin/env bash
# flashsample GPU bundle, written by `cargo xtask gpu-bundle`. Runs on a
# machine with an NVIDIA GPU and driver; needs no Rust toolchain.
#
#   ./run [tests] [sanitize] [bench]     (default: all three, in that order)
#
# Logs go to $OUT, or to out/ next to this script when OUT is unset:
#   environment.txt  tests.log  sanitizer.log  bench.log  bench.md  summary.txt
#   torch_ref.json (PyTorch references, when python3 has torch and triton)
# FLASHSAMPLE_SANITIZE=0 skips the compute-sanitizer step; FLASHSAMPLE_TORCH=0
# skips the PyTorch references of the bench step; FLASHSAMPLE_TESTS_ONLY runs
# only the GPU tests whose names contain it (and no other test executable).
set -uo pipefail

TESTS=(@TESTS@)
BENCHES=(@BENCHES@)
# FLASHSAMPLE_SANITIZE_TOOLS (space-separated) picks some of them.
read -r -a SANITIZE_TOOLS <<<"${FLASHSAMPLE_SANITIZE_TOOLS:-memcheck racecheck synccheck initcheck}"
# The tests the sanitizer runs: those whose names contain this, in every GPU
# test executable. Each prints
#   sanitize coverage: <test>: kernels <kernel>,<kernel>,...; cases <n>
# and together they must launch every kernel listed in SANITIZE_KERNELS.
SANITIZE_FILTER=sanitize_
SANITIZE_KERNELS=kernels.txt

usage() {
    echo "usage: $0 [tests] [sanitize] [bench]   (default: all)"
}

steps=()
for arg in "$@"; do
    case "$arg" in
        tests | sanitize | bench) steps+=("$arg") ;;
        all) steps+=(tests sanitize bench) ;;
        -h | --help)
            usage
            exit 0
            ;;
        *)
            echo "unknown step '$arg'" >&2
            usage >&2
            exit 2
            ;;
    esac
done
[ ${#steps[@]} -eq 0 ] && steps=(tests sanitize bench)

@PRELUDE@

# run_logged LOG COMMAND...: runs COMMAND (killed after STEP_TIMEOUT
# seconds, exit status 124), its output to the console and appended to LOG;
# returns COMMAND's exit status.
run_logged() {
    local log="$1"
    shift
    echo "\$ $*" | tee -a "$log"
    timeout --kill-after=10 "$STEP_TIMEOUT" "$@" 2>&1 | tee -a "$log"
    local rc=${PIPESTATUS[0]}
    if [ "$rc" -ne 0 ]; then
        echo "exit status $rc: $*" | tee -a "$log"
    fi
    return "$rc"
}

header() {
    printf '\n======== %s ========\n' "$*"
}

declare -A RESULT

step_tests() {
    local log="$OUT/tests.log" failed=() t name
    : >"$log"
    local only="${FLASHSAMPLE_TESTS_ONLY:-}"
    for t in "${TESTS[@]}"; do
        case "$t" in
            gpu | gpu_* | gpu-*)
                # GPU tests one at a time, each in its own process under the
                # step timeout: a hung kernel costs one test, not the run.
                for name in $("bin/$t" --list $only 2>/dev/null | sed -n 's/: test$//p'); do
                    run_logged "$log" "bin/$t" --exact "$name" || failed+=("$t::$name")
                done
                ;;
            *) [ -n "$only" ] || run_logged "$log" "bin/$t" || failed+=("$t") ;;
        esac
    done
    if [ ${#failed[@]} -eq 0 ]; then
        RESULT[tests]="ok (${#TESTS[@]} executables)"
    else
        RESULT[tests]="FAILED (${failed[*]})"
    fi
}

find_sanitizer() {
    local p
    if p="$(command -v compute-sanitizer)"; then
        echo "$p"
        return 0
    fi
    for p in /usr/local/cuda/bin/compute-sanitizer /usr/local/cuda/compute-sanitizer/compute-sanitizer; do
        if [ -x "$p" ]; then
            echo "$p"
            return 0
        fi
    done
    return 1
}

step_sanitize() {
    local log="$OUT/sanitizer.log" san t tool k line name listed=() runs=() names=() failed=() problems=()
    if [ "${FLASHSAMPLE_SANITIZE:-1}" = 0 ]; then
        RESULT[sanitize]="skipped (FLASHSAMPLE_SANITIZE=0)"
        return
    fi
    if ! san="$(find_sanitizer)"; then
        RESULT[sanitize]="skipped (compute-sanitizer not found)"
        return
    fi
    : >"$log"
    for t in "${TESTS[@]}"; do
        case "$t" in
            gpu | gpu_* | gpu-*) ;;
            *) continue ;;
        esac
        mapfile -t listed < <("bin/$t" --list "$SANITIZE_FILTER" 2>/dev/null | sed -n 's/: test$//p')
        for name in "${listed[@]}"; do
            runs+=("$t $name")
            names+=("$name")
        done
    done
    if [ ${#runs[@]} -eq 0 ]; then
        echo "no GPU test executable has a test with '$SANITIZE_FILTER' in its name" | tee -a "$log"
        RESULT[sanitize]="skipped (no test name contains '$SANITIZE_FILTER')"
        return
    fi
    # Each test in its own process under the step timeout: a slow one
    # (racecheck over many cluster launches) costs only its own result.
    for tool in "${SANITIZE_TOOLS[@]}"; do
        for k in "${runs[@]}"; do
            t="${k%% *}"
            name="${k#* }"
            run_logged "$log" "$san" --tool "$tool" --error-exitcode 1 \
                "bin/$t" --exact "$name" || failed+=("$t::$name under $tool")
        done
    done
    if [ ${#failed[@]} -gt 0 ]; then
        line="$(printf ', %s' "${failed[@]}")"
        problems+=("failed: ${line:2}")
        # The sanitizer fails a run that never calls CUDA: the tests skipped
        # the GPU, so nothing was checked.
        if grep -q 'terminated before first instrumented API call' "$log"; then
            problems+=("some runs made no CUDA call, see sanitizer.log")
        fi
    fi

    # Kernel coverage: the union of the kernels the tests report launching
    # (over every run) against the bundle's list of entry points.
    local reports kernels=() missing=() silent=() cases=0
    local -A launched=()
    reports="$(grep -o 'sanitize coverage: [^ ]*: kernels [^;]*; cases [0-9]*' "$log" | sort -u)"
    while IFS= read -r k; do
        [ -n "$k" ] && launched[$k]=1
    done < <(sed -n 's/.*: kernels \([^;]*\);.*/\1/p' <<<"$reports" | tr ',' '\n')
    for t in "${names[@]}"; do
        line="$(grep -m1 -F "sanitize coverage: $t: " <<<"$reports")"
        if [ -n "$line" ]; then
            cases=$((cases + ${line##* }))
        else
            silent+=("$t")
        fi
    done
    [ ${#silent[@]} -eq 0 ] || problems+=("no coverage line from ${silent[*]}")
    local summary="${#names[@]} tests under ${SANITIZE_TOOLS[*]}"
    if [ -f "$SANITIZE_KERNELS" ]; then
        mapfile -t kernels < <(grep -v '^$' "$SANITIZE_KERNELS")
        for k in "${kernels[@]}"; do
            [ -n "${launched[$k]:-}" ] || missing+=("$k")
        done
        summary+="; $((${#kernels[@]} - ${#missing[@]})) of ${#kernels[@]} kernels, $cases cases"
        [ ${#missing[@]} -eq 0 ] || problems+=("no test launched ${missing[*]}")
    else
        problems+=("no $SANITIZE_KERNELS in this bundle: kernel coverage unknown")
    fi
    echo "sanitize summary: $summary" | tee -a "$log"
    for k in "${problems[@]}"; do
        echo "sanitize problem: $k" | tee -a "$log"
    done

    if [ ${#problems[@]} -eq 0 ]; then
        RESULT[sanitize]="ok ($summary)"
    else
        RESULT[sanitize]="FAILED ($(printf '%s; ' "${problems[@]}")$summary)"
    fi
}

step_bench() {
    local log="$OUT/bench.log" failed=() b md ref="${FLASHSAMPLE_TORCH_REF:-}" note=""
    : >"$log"
    if [ ${#BENCHES[@]} -eq 0 ]; then
        RESULT[bench]="skipped (no bench executables in this bundle)"
        return
    fi
    # Same-run PyTorch references for the bench report, when this machine
    # has PyTorch (FLASHSAMPLE_TORCH=0 skips them; a preset
    # FLASHSAMPLE_TORCH_REF is used as is).
    if [ -z "$ref" ] && [ "${FLASHSAMPLE_TORCH:-1}" != 0 ] && [ -f scripts/torch_reference.py ]; then
        if python3 -c 'import torch, triton' >/dev/null 2>&1; then
            if run_logged "$log" python3 scripts/torch_reference.py "$OUT/torch_ref.json"; then
                ref="$OUT/torch_ref.json"
            else
                note="; PyTorch references failed, see bench.log"
            fi
        else
            note="; no PyTorch references (python3 cannot import torch and triton)"
            echo "note: python3 cannot import torch and triton: benching without PyTorch references" | tee -a "$log"
        fi
    fi
    for b in "${BENCHES[@]}"; do
        md="$OUT/bench.md"
        [ "$b" = sampling ] || md="$OUT/bench-$b.md"
        if [ -n "$ref" ]; then
            run_logged "$log" env FLASHSAMPLE_BENCH_OUT="$md" FLASHSAMPLE_TORCH_REF="$ref" "bin/$b" || failed+=("$b")
        else
            run_logged "$log" env FLASHSAMPLE_BENCH_OUT="$md" "bin/$b" || failed+=("$b")
        fi
    done
    if [ ${#failed[@]} -eq 0 ]; then
        RESULT[bench]="ok (report: $OUT/bench.md$note)"
    else
        RESULT[bench]="FAILED (${failed[*]}$note)"
    fi
}

header environment
{
    echo "date: $(date -u '+%Y-%m-%dT%H:%M:%SZ')"
    echo "host: $(uname -n) $(uname -srm)"
    if command -v nvidia-smi >/dev/null; then
        nvidia-smi -L || echo "nvidia-smi -L failed"
    else
        echo "nvidia-smi not found"
    fi
    echo "steps: ${steps[*]}"
    echo "out: $OUT"
} 2>&1 | tee "$OUT/environment.txt"

declare -A ELAPSED
for step in "${steps[@]}"; do
    header "$step"
    start=$SECONDS
    "step_$step"
    ELAPSED[$step]=$((SECONDS - start))
done

header summary
status=0
{
    for step in "${steps[@]}"; do
        printf '%-9s %s  [%ss]\n' "$step" "${RESULT[$step]}" "${ELAPSED[$step]}"
    done
} | tee "$OUT/summary.txt"
for step in "${steps[@]}"; do
    case "${RESULT[$step]}" in FAILED*) status=1 ;; esac
done
exit "$status"
