"""End-to-end GRPO steps/s with each rollout engine: `lmrl rl engine=hf` vs `engine=vllm` (needs vLLM).

    .venv-vllm/bin/python benchmarks/rl_engines.py                      # builtin:medium (6 heads), 16 x 8 x 64
    .venv-vllm/bin/python benchmarks/rl_engines.py --steps 6 --new-tokens 128 --precision bf16
    .venv-vllm/bin/python benchmarks/rl_engines.py --engines hf vllm vllm-server   # + vLLM in a server process

Same config for each (task:arithmetic prompts, seed 0) and a dense reward, the share of digits in the completion,
so that every step trains (the `task` reward is 0 for every sample of a random model: zero advantages, no backward,
and the timing would be rollouts only). Each run is `online.train` in this process, one after the other
(`vllm-server`: engine=vllm vllm_server=auto, vLLM in a child `lmrl vllm-serve` process). A step's time is its
`time/rollout_s` (engine=vllm: including the weight sync before it) plus `time/train_s` (reference/old log-probs,
the loss, backward, optimizer step); steps/s is over steps 2.. (step 1 warms up the engine).
"""

from __future__ import annotations

import argparse
import os
import tempfile

os.environ.setdefault("VLLM_ENABLE_V1_MULTIPROCESSING", "0")

from lmrl.config import load_config  # noqa: E402
from lmrl.rewards import register_reward  # noqa: E402
from lmrl.tracking import read_jsonl  # noqa: E402
from lmrl.trainers.rl import trainer as online  # noqa: E402


def digit_share(prompts, completions, **kwargs):
    """Dense reward: the share of completion characters that are digits."""
    return [sum(c.isdigit() for c in text) / max(1, len(text)) for text in completions]


register_reward("bench_digit_share")(lambda **_: digit_share)
ENGINE_KEYS = {"hf": ["engine=hf"], "vllm": ["engine=vllm"], "vllm-server": ["engine=vllm", "vllm_server=auto"]}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--steps", type=int, default=5)
    parser.add_argument("--prompts", type=int, default=16)
    parser.add_argument("--samples", type=int, default=8)
    parser.add_argument("--new-tokens", type=int, default=64)
    parser.add_argument("--precision", choices=("fp32", "bf16"), default="fp32")
    parser.add_argument("--engines", nargs="+", default=["hf", "vllm"], choices=("hf", "vllm", "vllm-server"))
    args = parser.parse_args()
    out = tempfile.mkdtemp(prefix="lmrl-rl-engines-")
    for engine in args.engines:
        config = load_config(
            online.RLConfig,
            None,
            [
                *ENGINE_KEYS[engine],
                "model=builtin:medium",
                "model_args.num_attention_heads=6",
                f"precision={args.precision}",
                f"prompts_per_step={args.prompts}",
                f"samples_per_prompt={args.samples}",
                f"max_new_tokens={args.new_tokens}",
                f"max_steps={args.steps}",
                "eval_every=0",
                "save_every=0",
                "eval_rows=8",
                "log_every=1",
                f"output_dir={out}/{engine}",
                "vllm_kv_cache_gb=2",
                "rewards=[bench_digit_share]",
            ],
        )
        online.train(config)
        rows = [r for r in read_jsonl(f"{out}/{engine}/metrics.jsonl") if "time/rollout_s" in r][1:]
        rollout = sum(r["time/rollout_s"] for r in rows) / len(rows)
        train = sum(r["time/train_s"] for r in rows) / len(rows)
        tokens = sum(r["tokens_per_s"] * r["time/rollout_s"] for r in rows) / len(rows)
        sync = sum(r.get("time/weight_sync_s", 0.0) for r in rows) / len(rows)
        gap = max(r.get("policy/sampler_logp_gap", 0.0) for r in rows)
        trained = sum("policy/sampler_logp_gap" in r for r in rows)  # logged on every step that ran a backward
        print(
            f"{engine:11s} {args.precision}: {1 / (rollout + train):.3f} steps/s  rollout {rollout:.2f} s "
            f"({tokens / rollout:.0f} tok/s, sync {sync:.2f} s)  train {train:.2f} s ({trained}/{len(rows)} steps "
            f"trained)  max sampler_logp_gap {gap:.2e}"
        )


if __name__ == "__main__":
    main()
