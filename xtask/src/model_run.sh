#!/usr/bin/env bash
# The real-model GPU run, written by `cargo xtask model-bundle` into the last
# part of the model bundle. Joins the model's slices from every part, checks
# its SHA-256, then runs the model tests (the fused sampler against the
# unfused path on SmolLM2, candle's greedy decoding) and `generate` with and
# without --fused, and with top-k/top-p (the Qrita kernels). Logs go to
# $OUT (or out/ next to this script).
set -uo pipefail
HERE="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
ROOT="$(dirname "$HERE")"
OUT="${OUT:-$HERE/out}"
mkdir -p "$OUT" || exit 1
export FLASHSAMPLE_MODEL_DIR="${TMPDIR:-/tmp}/flashsample-model"
mkdir -p "$FLASHSAMPLE_MODEL_DIR" || exit 1
MODEL="$FLASHSAMPLE_MODEL_DIR/@MODEL_FILE@"
# Slices in part order (p1, p2, ... never beyond p9).
cat "$ROOT"/p[1-9]/model.gguf.[1-9] >"$MODEL" || exit 1
if ! echo "@SHA256@  $MODEL" | sha256sum -c - >"$OUT/model-check.txt" 2>&1; then
    echo "the joined model does not match its SHA-256: a part is missing (carry every part in consecutive calls)" | tee -a "$OUT/model-check.txt"
    exit 1
fi
bin() { ls "$ROOT"/p[1-9]/bin/"$1" 2>/dev/null | head -1; }
MODEL_TEST="$(bin model)"
GENERATE="$(bin generate)"
export FLASHSAMPLE_REQUIRE_GPU=1 FLASHSAMPLE_REQUIRE_MODEL=1
export LD_LIBRARY_PATH="/usr/local/cuda/lib64${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
status=0
timeout --kill-after=10 "${FLASHSAMPLE_STEP_TIMEOUT:-400}" "$MODEL_TEST" --test-threads=1 --nocapture >"$OUT/model-tests.log" 2>&1 || status=1
PROMPT="Write a short story about a lighthouse keeper."
timeout --kill-after=10 120 "$GENERATE" --prompt "$PROMPT" --max-tokens 128 --seed 7 >"$OUT/generate.log" 2>&1 || status=1
timeout --kill-after=10 120 "$GENERATE" --fused --prompt "$PROMPT" --max-tokens 128 --seed 7 >"$OUT/generate-fused.log" 2>&1 || status=1
timeout --kill-after=10 120 "$GENERATE" --prompt "$PROMPT" --max-tokens 128 --seed 7 --top-k 50 --top-p 0.9 >"$OUT/generate-topk.log" 2>&1 || status=1
tail -3 "$OUT/model-tests.log"
exit "$status"
