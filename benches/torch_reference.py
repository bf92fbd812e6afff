# Same-run PyTorch references for the flashsample benches: each case the Rust
# bench times is timed here too (CUDA events through triton's do_bench,
# median), on the same shapes and the same kind of data.
# Usage (on the GPU machine): python3 benches/torch_reference.py out.json
import json
import sys

import torch
from triton.testing import do_bench

torch.manual_seed(0)
dev = "cuda"


def bench(fn):
    return do_bench(fn, warmup=25, rep=100, return_mode="median") * 1000.0  # us


res = {}
for V in [128256, 262144]:
    for B in [1, 32, 128, 1024]:
        logits = torch.randn(B, V, device=dev) * 2.5
        t = torch.full((B, 1), 0.8, device=dev)

        def gumbel():
            g = -torch.log(-torch.log(torch.rand_like(logits)))
            return (logits / t + g).argmax(-1)

        def multinomial():
            return torch.multinomial(torch.softmax(logits / t, -1), 1)

        res[f"sampling_from_logits f32 B={B} V={V}"] = dict(
            torch_gumbel_argmax_us=round(bench(gumbel), 1),
            torch_softmax_multinomial_us=round(bench(multinomial), 1),
        )
        res[f"softmax f32 B={B} V={V}"] = dict(torch_softmax_us=round(bench(lambda: torch.softmax(logits / t, -1)), 1))
        print(B, V, res[f"sampling_from_logits f32 B={B} V={V}"], flush=True)
        del logits
for V, d in [(151936, 4096), (128256, 8192), (262144, 5376)]:
    W = (torch.rand(V, d, device=dev, dtype=torch.bfloat16) * 2 - 1) * (3.0 / d**0.5)
    for B in [1, 8, 32, 64, 128, 256]:
        h = torch.rand(B, d, device=dev, dtype=torch.bfloat16) * 2 - 1

        def mm_gumbel():
            logits = (h @ W.T).float()
            g = -torch.log(-torch.log(torch.rand_like(logits)))
            return (logits / 0.8 + g).argmax(-1)

        res[f"fused bf16 B={B} V={V} d={d}"] = dict(
            torch_matmul_us=round(bench(lambda: h @ W.T), 1),
            torch_mm_gumbel_us=round(bench(mm_gumbel), 1),
        )
        print(B, V, d, res[f"fused bf16 B={B} V={V} d={d}"], flush=True)
    del W
json.dump(res, open(sys.argv[1], "w"), indent=1)
