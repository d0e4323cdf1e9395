"""SFT training step, padded rows vs packed rows (`max_tokens_per_microbatch`), on a long-tailed length distribution.

Rows of random tokens whose lengths follow a log-normal law clipped to [16, 512] (median ~64: most rows short, a few
near the maximum, as in long-reasoning data), the first quarter of each row a prompt (label -100). Each variant runs
in its own subprocess (so its peak RSS is its own): ``steps`` SFT optimizer steps of ``batch`` rows on a built-in
model, fp32, after one warm-up step; reported: labelled tokens/s and the peak RSS (VmHWM) minus the RSS before the
first step. ``padded``: ``micro`` rows per micro-batch, each padded to its longest row (rows in the epoch order, as
lmrl's SFT does). ``packed N``: rows packed first-fit-decreasing into sequences of <= N tokens.

    python benchmarks/packing.py                       # builtin:small, 64 rows/step, padded (8 rows) vs packed 1024/2048
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import time
from pathlib import Path

import torch

from lmrl.data.sft import SFTExample
from lmrl.data.tokenizers import build_char_tokenizer
from lmrl.models import load_model
from lmrl.trainers import common, sft_step
from lmrl.trainers.sft.config import SFTConfig


def status_mb(key: str) -> float:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith(key + ":"):
            return int(line.split()[1]) / 1024
    return float("nan")


def rows(count: int, vocab: int, seed: int) -> list[SFTExample]:
    g = torch.Generator().manual_seed(seed)
    lengths = torch.exp(torch.randn(count, generator=g) * 0.8 + 4.2).clamp(16, 512).long().tolist()
    out = []
    for n in lengths:
        ids = torch.randint(3, vocab, (n,), generator=g).tolist()
        out.append(SFTExample(ids, [-100] * (n // 4) + ids[n // 4 :]))
    return out


def child(args) -> dict:
    torch.manual_seed(0)
    torch.set_num_threads(args.threads)
    tokenizer = build_char_tokenizer()
    model = load_model(f"builtin:{args.model}", tokenizer, seed=0)
    config = SFTConfig(output_dir="/tmp/packing-bench", lr=1e-4, warmup_steps=0)
    optimizer = common.build_optimizer(model, config)
    scheduler = common.build_scheduler(optimizer, config)
    data = rows(args.batch * (args.steps + 1), len(tokenizer), seed=0)
    tokens, elapsed, base = 0, 0.0, 0.0
    for step in range(args.steps + 1):
        batch = data[step * args.batch : (step + 1) * args.batch]
        if step == 1:
            base = status_mb("VmRSS")
            Path("/proc/self/clear_refs").write_text("5")  # VmHWM := VmRSS
        t0 = time.perf_counter()
        if args.variant == "padded":
            micro = sft_step.padded_micro_batches(batch, tokenizer.pad_token_id, args.batch // args.micro)
        else:
            micro = sft_step.packed_micro_batches(batch, int(args.variant))
        stats = sft_step.train_step(model, micro, None, step, sft_step.labelled_tokens(batch))
        common.optimizer_step(model, optimizer, scheduler, 1.0, step)
        if step:
            elapsed += time.perf_counter() - t0
            tokens += stats["tokens"]
    return {
        "variant": args.variant,
        "tokens_per_s": tokens / elapsed,
        "peak_mb": status_mb("VmHWM") - base,
        "micro_batches": len(micro),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", default="small")
    parser.add_argument("--batch", type=int, default=64)
    parser.add_argument("--micro", type=int, default=8, help="rows per padded micro-batch")
    parser.add_argument("--steps", type=int, default=3)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--variants", nargs="+", default=["padded", "1024", "2048"])
    parser.add_argument("--variant", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.variant:
        print(json.dumps(child(args)))
        return
    results = []
    for variant in args.variants:
        cmd = [sys.executable, __file__, "--variant", variant] + [
            f"--{k}={v}" for k, v in vars(args).items() if k in ("model", "batch", "micro", "steps", "threads")
        ]
        out = subprocess.run(cmd, check=True, capture_output=True, text=True).stdout.strip().splitlines()[-1]
        results.append(json.loads(out))
        print(results[-1], flush=True)
    padded = results[0]
    print(
        "\n| variant | micro-batches/step | tokens/s | vs padded | peak MB over start | vs padded |\n|---|---|---|---|---|---|"
    )
    for r in results:
        print(
            f"| {r['variant']} | {r['micro_batches']} | {r['tokens_per_s']:.0f} | "
            f"{r['tokens_per_s'] / padded['tokens_per_s']:.2f}x | {r['peak_mb']:.0f} | "
            f"{r['peak_mb'] / padded['peak_mb']:.2f}x |"
        )


if __name__ == "__main__":
    main()
