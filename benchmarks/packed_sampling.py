"""Sampling with weights packed once per rollout (`lmrl.models.packed`) against plain autocast `F.linear`: HFEngine
rollouts under bf16 autocast on a CPU, the two alternating on the same model, prompts and seeds.

    python benchmarks/packed_sampling.py --model path/to/hf-folder --chat      # e.g. grpo_vs_trl.py --workdir's model/
    python benchmarks/packed_sampling.py                                       # builtin:medium, plain prompts

Prints each round's seconds per rollout, the medians, and whether the two gave the same tokens and log-probs (they
must: the packed product is bitwise autocast's). A benchmark, not a test.
"""

from __future__ import annotations

import argparse
import random
import statistics
import time

import torch

from lmrl.data.tasks import get_task
from lmrl.models import load_model_and_tokenizer
from lmrl.models.replay import SamplingRecorder
from lmrl.rollout import HFEngine, SamplingParams


def prompt_ids(tokenizer, count: int, chat: bool) -> list[list[int]]:
    task, rng = get_task("arithmetic", style="chat" if chat else "plain"), random.Random(0)
    texts = [task.sample(rng).prompt for _ in range(count)]
    if chat:
        texts = [
            tokenizer.apply_chat_template([{"role": "user", "content": t}], add_generation_prompt=True, tokenize=False)
            for t in texts
        ]
    return [tokenizer(t, add_special_tokens=False)["input_ids"] for t in texts]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", default="builtin:medium")
    parser.add_argument("--chat", action="store_true", help="chat-template prompts (an instruct model)")
    parser.add_argument("--prompts", type=int, default=8)
    parser.add_argument("--samples", type=int, default=4)
    parser.add_argument("--max-new-tokens", type=int, default=64)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--record", action="store_true", help="record linear outputs, as an RL rollout does")
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    model, tokenizer = load_model_and_tokenizer(args.model)
    model.eval()
    ids = prompt_ids(tokenizer, args.prompts, args.chat)
    params = SamplingParams(max_new_tokens=args.max_new_tokens, temperature=1.0)
    engines = {
        "packed": HFEngine(model, tokenizer, torch.bfloat16),
        "plain": HFEngine(model, tokenizer, torch.bfloat16, pack_weights=False),
    }
    times: dict[str, list[float]] = {name: [] for name in engines}
    same = True
    for rnd in range(args.rounds + 1):  # round 0 warms up (the packed path checks each weight shape once)
        batches = {}
        for name, engine in engines.items():
            start = time.perf_counter()
            batches[name] = engine.generate(
                ids,
                params,
                n=args.samples,
                generator=torch.Generator().manual_seed(rnd),
                recorder=SamplingRecorder() if args.record else None,
            )
            if rnd:
                times[name].append(time.perf_counter() - start)
        a, b = batches["packed"], batches["plain"]
        same &= torch.equal(a.completion_ids, b.completion_ids) and torch.equal(a.sampler_logp, b.sampler_logp)
        if rnd:
            print(f"round {rnd}: " + ", ".join(f"{n} {times[n][-1]:.2f} s" for n in engines), flush=True)
    packed, plain = (statistics.median(times[n]) for n in ("packed", "plain"))
    calls = engines["packed"].metrics().get("rollout/packed_linear_calls", 0)
    print(
        f"{args.model}: {args.prompts} x {args.samples} x {args.max_new_tokens}, {args.threads} thread(s): median "
        f"packed {packed:.2f} s, plain {plain:.2f} s per rollout ({plain / packed:.2f}x); per-round ratios "
        + ", ".join(f"{p / q:.2f}" for p, q in zip(times["plain"], times["packed"], strict=True))
        + f"; same tokens and log-probs: {same}; packed forwards counted over the rounds: {calls}"
    )


if __name__ == "__main__":
    main()
