HERE="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
OUT="${OUT:-$HERE/out}"
mkdir -p "$OUT" || exit 1
OUT="$(cd "$OUT" && pwd)"
cd "$HERE" || exit 1

export FLASHSAMPLE_REQUIRE_GPU=1
# The bundle's subset of the SmolLM2 logits corpus, when it carries one
# (the real rows of the tests and benches).
if [ -f "$HERE/data/corpus.bin" ]; then
    export FLASHSAMPLE_CORPUS="$HERE/data/corpus.bin"
fi
export LD_LIBRARY_PATH="/usr/local/cuda/lib64${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"

# The driver compiles an executable's PTX module on its first load (45 to
# 60 s for the whole module on the H200) and keeps the result in its
# compute cache; a cache in /tmp of up to 4 GiB (the largest it takes)
# holds the modules of several builds at once, so processes alternating
# between two builds (ab-bundle, a bench against a variant) compile each
# module once (session 23: the topk bench took 93 s as its build's first
# process, and 18 s as the next process of a build compiled earlier).
export CUDA_CACHE_PATH="${CUDA_CACHE_PATH:-/tmp/flashsample-cuda-cache}"
export CUDA_CACHE_MAXSIZE="${CUDA_CACHE_MAXSIZE:-4294967296}"

# Seconds any one command may run (a hung kernel must not eat the whole
# device lease): FLASHSAMPLE_STEP_TIMEOUT, default 300.
STEP_TIMEOUT="${FLASHSAMPLE_STEP_TIMEOUT:-300}"

# NCCL for the multi-GPU tensor-parallel tests and bench. cudarc opens
# `libnccl.so` (or `libnccl.so.N` for N in 13, 12, 11, 10, 9, 1), while NCCL
# 2.x installs `libnccl.so.2` (the system's, or that of python3's
# nvidia-nccl wheel): when the loader knows no `libnccl.so`, link the one
# found as lib/libnccl.so beside this script. NVLink multicast stays off:
# it can take a shared host's GPUs out of service.
if ! ldconfig -p 2>/dev/null | grep -q 'libnccl\.so '; then
    nccl="$(ldconfig -p 2>/dev/null | sed -n 's/.*libnccl\.so\.2 .*=> //p' | head -n1)"
    if [ -z "$nccl" ]; then
        for d in $(python3 -c 'import nvidia.nccl as m; print(*m.__path__)' 2>/dev/null); do
            [ -f "$d/lib/libnccl.so.2" ] && nccl="$d/lib/libnccl.so.2" && break
        done
    fi
    if [ -n "$nccl" ] && mkdir -p "$HERE/lib" && ln -sf "$nccl" "$HERE/lib/libnccl.so"; then
        LD_LIBRARY_PATH="$HERE/lib:$LD_LIBRARY_PATH"
    fi
fi
export NCCL_NVLS_ENABLE=0
