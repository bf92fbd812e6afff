HERE="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
OUT="${OUT:-$HERE/out}"
mkdir -p "$OUT" || exit 1
OUT="$(cd "$OUT" && pwd)"
cd "$HERE" || exit 1

export FLASHSAMPLE_REQUIRE_GPU=1
export LD_LIBRARY_PATH="/usr/local/cuda/lib64${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"

# Seconds any one command may run (a hung kernel must not eat the whole
# device lease): FLASHSAMPLE_STEP_TIMEOUT, default 300.
STEP_TIMEOUT="${FLASHSAMPLE_STEP_TIMEOUT:-300}"
