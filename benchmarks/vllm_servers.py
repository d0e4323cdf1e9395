"""vLLM server replicas and async RL on vLLM's CPU build: weight-push time and rollout tokens/s with 1 vs 2
`lmrl vllm-serve` replicas, and GRPO steps/s with ``async_steps`` = 0, 1, 2 on the two replicas.

Run in the environment that has vLLM (it starts the two servers as child processes, `vllm_server=auto`'s way):

    .venv-vllm/bin/python benchmarks/vllm_servers.py                 # a few minutes on 2 CPU cores
    .venv-vllm/bin/python benchmarks/vllm_servers.py --rounds 5 --steps 12
    .venv-vllm/bin/python benchmarks/vllm_servers.py --push --rounds 5   # push time: http vs gloo (weight transport)

- Rollout: a random 4-layer Qwen2 (hidden 256, fp32), ``--prompts`` prompts x 4 samples x 32 new tokens at
  temperature 1; each round perturbs the weights, times the push (``sync_weights``: to one replica, or serialized
  once and sent to both concurrently) and the rollout that follows. Medians over ``--rounds``.
- Async: ``lmrl rl`` in this process (built-in model, hidden 128, 8 prompts x 4 samples x 16 tokens, a dense
  reward) with ``vllm_servers=[both]``; steps/s from ``metrics.jsonl``'s ``time_s`` after 2 warm-up steps, median
  of ``--rounds`` runs. Nothing is asserted: this measures the machine as much as the code, and here the trainer
  and both servers share the same 2 cores.
"""

from __future__ import annotations

import argparse
import json
import statistics
import tempfile
import time
from pathlib import Path

import torch


def digit_share(prompts, completions, **kwargs) -> list[float]:
    return [sum(c.isdigit() for c in text) / max(1, len(text)) for text in completions]


def rollout_rows(servers, rounds: int, prompts: int) -> list[dict]:
    from transformers import Qwen2Config, Qwen2ForCausalLM

    from lmrl.data.tokenizers import build_char_tokenizer
    from lmrl.rollout import SamplingParams
    from lmrl.rollout.engines.vllm.driver import VLLMOptions
    from lmrl.rollout.engines.vllm.engine import VLLMEngine
    from lmrl.rollout.engines.vllm.replicas import Replicas, start_all

    tok = build_char_tokenizer()
    torch.manual_seed(0)
    model = Qwen2ForCausalLM(
        Qwen2Config(
            vocab_size=len(tok),
            hidden_size=256,
            num_hidden_layers=4,
            num_attention_heads=4,
            num_key_value_heads=2,
            intermediate_size=512,
            max_position_embeddings=256,
            tie_word_embeddings=True,
        )
    ).eval()
    options = VLLMOptions(max_model_len=128, kv_cache_gb=0.25, seed=0)
    ids = [tok(f"{i}+{i * 7}=", add_special_tokens=False)["input_ids"] for i in range(prompts)]
    params = SamplingParams(max_new_tokens=32, temperature=1.0)
    remotes = start_all(servers, 600, model, options)
    rows = []
    for name, driver in (("1 replica", remotes[0]), ("2 replicas", Replicas(remotes))):
        engine = VLLMEngine(model, tok, options, driver=driver)
        engine.generate(ids[:2], params, n=1, generator=torch.Generator().manual_seed(0))  # first push, warm-up
        syncs, rates = [], []
        for r in range(rounds):
            with torch.no_grad():
                for p in model.parameters():
                    p.add_(torch.randn_like(p) * 1e-3)
            syncs.append(engine.sync_weights())
            t0 = time.perf_counter()
            batch = engine.generate(ids, params, n=4, generator=torch.Generator().manual_seed(r))
            rates.append(batch.completion_mask.sum().item() / (time.perf_counter() - t0))
        rows.append({"setup": name, "sync_s": statistics.median(syncs), "tokens_per_s": statistics.median(rates)})
    for remote in remotes:
        remote.close()
    return rows


def async_rows(servers, rounds: int, steps: int) -> list[dict]:
    from lmrl.config import load_config
    from lmrl.rewards import REWARDS, register_reward
    from lmrl.tracking import read_jsonl
    from lmrl.trainers.rl import trainer as online

    if "bench_digit_share" not in REWARDS:
        register_reward("bench_digit_share")(lambda **_: digit_share)
    rows = []
    for k in (0, 1, 2):
        rates = []
        for r in range(rounds):
            with tempfile.TemporaryDirectory() as out:
                config = load_config(
                    online.RLConfig,
                    None,
                    [
                        "algorithm=grpo",
                        "engine=vllm",
                        f"vllm_servers=[{','.join(servers)}]",
                        f"async_steps={k}",
                        f"output_dir={out}",
                        "precision=fp32",
                        "model_args.hidden_size=128",
                        "model_args.num_hidden_layers=2",
                        "model_args.intermediate_size=256",
                        "model_args.num_attention_heads=4",
                        "task_args.digits=2",
                        "train_rows=256",
                        "eval_rows=4",
                        "prompts_per_step=8",
                        "samples_per_prompt=4",
                        "max_new_tokens=16",
                        f"max_steps={steps}",
                        "rewards=[bench_digit_share]",
                        "eval_every=0",
                        "save_every=0",
                        "log_every=1",
                        "lr=1e-3",
                        "sample_every=1000",
                        "vllm_kv_cache_gb=0.125",
                        "vllm_max_model_len=128",
                        f"seed={r}",
                    ],
                )
                online.train(config)
                times = [
                    m["time_s"]
                    for m in read_jsonl(Path(out) / "metrics.jsonl")
                    if m.get("step", 0) > 0 and "reward/mean" in m
                ]
            rates.append((len(times) - 3) / (times[-1] - times[2]))  # steps after the first 3 (warm-up)
        rows.append({"setup": f"async_steps={k}", "steps_per_s": statistics.median(rates)})
    return rows


def push_rows(servers, rounds: int) -> list[dict]:
    """Seconds per push (median of `rounds`, after a warm-up push) over HTTP and over a gloo group, to 1 and 2
    replicas, for the rollout's tiny Qwen2 and engine_speed.py's 40.9M-parameter Qwen2 (vocabulary 32768)."""
    from transformers import Qwen2Config, Qwen2ForCausalLM

    from lmrl.rollout.engines.vllm.driver import VLLMOptions
    from lmrl.rollout.engines.vllm.engine import VLLMEngine
    from lmrl.rollout.engines.vllm.replicas import Replicas, start_all

    rows = []
    for name, vocab, hidden, layers in (("tiny", 128, 256, 4), ("qwen2 40.9M", 32768, 512, 8)):
        torch.manual_seed(0)
        model = Qwen2ForCausalLM(
            Qwen2Config(
                vocab_size=vocab,
                hidden_size=hidden,
                num_hidden_layers=layers,
                num_attention_heads=hidden // 64,
                num_key_value_heads=2,
                intermediate_size=2 * hidden if name == "tiny" else 3 * hidden,
                max_position_embeddings=256,
                tie_word_embeddings=True,
            )
        ).eval()
        params = sum(p.numel() for p in model.parameters()) / 1e6
        options = VLLMOptions(max_model_len=128, kv_cache_gb=0.25, seed=0)
        remotes = start_all(servers, 600, model, options)
        for replicas in (1, 2):
            for transport in ("http", "gloo"):
                driver = Replicas(remotes[:replicas])
                driver.use_transport(transport, "cpu")
                engine = VLLMEngine(model, None, options, driver=driver)
                engine.sync_weights()  # warm-up (and the group's first use)
                times = []
                for _ in range(rounds):
                    with torch.no_grad():
                        for p in model.parameters():
                            p.add_(torch.randn_like(p) * 1e-3)
                    times.append(engine.sync_weights())
                rows.append(
                    {"model": f"{name} ({params:.1f}M)", "replicas": replicas, "transport": transport,
                     "push_s": statistics.median(times), "min_s": min(times)}
                )  # fmt: skip
                print(rows[-1], flush=True)
        for remote in remotes:
            remote.close()
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--prompts", type=int, default=32)
    parser.add_argument("--steps", type=int, default=10)
    parser.add_argument("--push", action="store_true", help="only the push time: vllm_weight_transport=http vs gloo")
    args = parser.parse_args()
    from lmrl.rollout.engines.vllm.client import spawn

    spawned = [spawn(timeout=600) for _ in range(2)]
    servers = [remote.url.removeprefix("http://") for remote in spawned]
    if args.push:
        try:
            pushes = push_rows(servers, args.rounds)
        finally:
            for remote in spawned:
                remote.close()
        print("| model | replicas | vllm_weight_transport | push (s, median) | fastest (s) |\n|---|---|---|---|---|")
        for row in pushes:
            print(
                f"| {row['model']} | {row['replicas']} | {row['transport']} | {row['push_s']:.3f} | {row['min_s']:.3f} |"
            )
        print(json.dumps(pushes))
        return
    try:
        rollout = rollout_rows(servers, args.rounds, args.prompts)
        asyncs = async_rows(servers, args.rounds, args.steps)
    finally:
        for remote in spawned:
            remote.close()
    base = rollout[0]
    print("| setup | weight push (s) | rollout tokens/s | vs 1 replica |\n|---|---|---|---|")
    for row in rollout:
        print(
            f"| {row['setup']} | {row['sync_s']:.3f} | {row['tokens_per_s']:.0f} | "
            f"{row['tokens_per_s'] / base['tokens_per_s']:.2f}x |"
        )
    print("\n| setup | GRPO steps/s | vs async_steps=0 |\n|---|---|---|")
    for row in asyncs:
        print(f"| {row['setup']} | {row['steps_per_s']:.2f} | {row['steps_per_s'] / asyncs[0]['steps_per_s']:.2f}x |")
    print(json.dumps({"rollout": rollout, "async": asyncs}))


if __name__ == "__main__":
    main()
