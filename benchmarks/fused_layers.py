"""Per-call time of one RMSNorm and one SwiGLU MLP, HF's own forward against `lmrl.models.fused`, in sampling (no
autograd, batch of one new token per row) and in training (forward + backward over whole sequences), bf16 autocast.

    python benchmarks/fused_layers.py --model path/to/hf-folder          # e.g. grpo_vs_trl.py --workdir's model/
    python benchmarks/fused_layers.py                                     # builtin:medium

Prints microseconds per call (median of --repeats timings of --calls calls each). A benchmark, not a test.
"""

from __future__ import annotations

import argparse
import copy
import statistics
import time

import torch

from lmrl.models import load_model
from lmrl.models.fused import fuse_layers


def per_call_us(fn, calls: int, repeats: int) -> float:
    fn()
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        for _ in range(calls):
            fn()
        times.append((time.perf_counter() - start) / calls * 1e6)
    return statistics.median(times)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", default="builtin:medium")
    parser.add_argument("--rows", type=int, default=32)
    parser.add_argument("--tokens", type=int, default=109, help="sequence length of the training case")
    parser.add_argument("--calls", type=int, default=20)
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--threads", type=int, default=1)
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    plain = load_model(args.model).eval()
    fused = copy.deepcopy(plain)
    print(f"{args.model}: fused {fuse_layers(fused)}, {args.threads} thread(s), bf16 autocast")
    width = plain.config.hidden_size
    for label, shape, train in (
        ("sampling", (args.rows, 1, width), False),
        ("training", (args.rows, args.tokens, width), True),
    ):
        x = torch.randn(*shape, requires_grad=train)
        for part in ("input_layernorm", "mlp"):
            results = []
            for model in (plain, fused):
                module = getattr(model.model.layers[0], part)

                def call(module=module):
                    with torch.autocast("cpu", dtype=torch.bfloat16):
                        out = module(x)
                    if train:
                        out.float().sum().backward()

                with torch.inference_mode(not train):
                    results.append(per_call_us(call, args.calls, args.repeats))
            print(f"  {label:8s} {part:16s} HF {results[0]:9.1f} us   fused {results[1]:9.1f} us")


if __name__ == "__main__":
    main()
