"""Rollout throughput of lmrl's two engines: `HFEngine` (engine=hf) vs `VLLMEngine` (engine=vllm, colocated), and the
cost of one in-place weight sync. Needs vLLM (`make test-vllm` builds .venv-vllm with the CPU build).

    .venv-vllm/bin/python benchmarks/engine_speed.py --model medium      # builtin:medium layout, 128 x 256 tokens
    .venv-vllm/bin/python benchmarks/engine_speed.py --model qwen2       # a Qwen2-architecture model (tied head)
    .venv-vllm/bin/python benchmarks/engine_speed.py --model qwen2 --hidden 1024 --layers 16 --sync-only  # sync cost
    .venv-vllm/bin/python benchmarks/engine_speed.py --model medium --server   # + vLLM in a `lmrl vllm-serve` process

Random weights, random prompts of 16-48 tokens, `--prompts` x `--samples` completions of exactly `--new-tokens`
tokens (no stop token is ever sampled, so both engines do identical work), temperature 1. Tokens/s counts completion
tokens; best of `--repeats` interleaved runs after a warm-up. `--server` adds a third contender, the same engine
with vLLM in a child `lmrl vllm-serve` process (vllm_server=auto: HTTP requests, weights pushed as safetensors). `builtin:medium` has head size 48, which vLLM's CPU
attention does not run, so `medium` here has 6 heads of 64 (same parameter count and FLOPs).
"""

from __future__ import annotations

import argparse
import os
import time

os.environ.setdefault("VLLM_ENABLE_V1_MULTIPROCESSING", "0")

import torch  # noqa: E402
from rollout_speed import EOS, PAD, _IdTokenizer, race  # noqa: E402
from transformers import LlamaForCausalLM, Qwen2Config, Qwen2ForCausalLM  # noqa: E402

from lmrl.models.loading import builtin_config  # noqa: E402
from lmrl.rollout import HFEngine, SamplingParams  # noqa: E402
from lmrl.rollout.engines.vllm.client import server_driver  # noqa: E402
from lmrl.rollout.engines.vllm.engine import VLLMEngine, VLLMOptions  # noqa: E402


def build(name: str, vocab: int, hidden: int = 512, layers: int = 8):
    torch.manual_seed(0)
    if name == "medium":
        config = builtin_config("builtin:medium", vocab, PAD, EOS, num_attention_heads=6)
        return LlamaForCausalLM(config).eval()
    config = Qwen2Config(
        vocab_size=vocab,
        hidden_size=hidden,
        num_hidden_layers=layers,
        num_attention_heads=hidden // 64,
        num_key_value_heads=2,
        intermediate_size=3 * hidden,
        max_position_embeddings=1024,
        tie_word_embeddings=True,
        pad_token_id=PAD,
        eos_token_id=EOS,
    )
    return Qwen2ForCausalLM(config).eval()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", choices=("medium", "qwen2"), default="medium")
    parser.add_argument("--vocab", type=int, default=0, help="0: 128 for medium (char-sized), 32768 for qwen2")
    parser.add_argument("--prompts", type=int, default=16)
    parser.add_argument("--samples", type=int, default=8)
    parser.add_argument("--new-tokens", type=int, default=256)
    parser.add_argument("--repeats", type=int, default=2)
    parser.add_argument("--dtypes", nargs="+", default=["fp32", "bf16"], choices=("fp32", "bf16"))
    parser.add_argument("--kv-gb", type=float, default=2.0, help="vLLM KV-cache budget (GiB)")
    parser.add_argument("--hidden", type=int, default=512, help="qwen2: hidden size (heads of 64)")
    parser.add_argument("--layers", type=int, default=8, help="qwen2: layers")
    parser.add_argument("--sync-only", action="store_true", help="only time vLLM's start and weight syncs")
    parser.add_argument("--server", action="store_true", help="also vLLM in a server process (vllm_server=auto)")
    args = parser.parse_args()

    vocab = args.vocab or (128 if args.model == "medium" else 32768)
    model = build(args.model, vocab, args.hidden, args.layers)
    tok = _IdTokenizer(vocab)
    gen = torch.Generator().manual_seed(0)
    lengths = torch.randint(16, 49, (args.prompts,), generator=gen).tolist()
    prompts = [torch.randint(3, vocab, (n,), generator=gen).tolist() for n in lengths]
    params = SamplingParams(max_new_tokens=args.new_tokens, temperature=1.0, stop_token_ids=())
    n_params = sum(p.numel() for p in model.parameters())
    print(
        f"{args.model}: {n_params / 1e6:.1f}M params, vocab {vocab}, {torch.get_num_threads()} torch threads; "
        f"{args.prompts} prompts x {args.samples} samples x {args.new_tokens} new tokens"
    )
    for name in args.dtypes:
        dtype = torch.bfloat16 if name == "bf16" else None
        hf = HFEngine(model, tok, autocast_dtype=dtype)
        options = VLLMOptions(
            max_model_len=64 + args.new_tokens,
            dtype=dtype or torch.float32,
            kv_cache_gb=args.kv_gb,
            max_num_seqs=args.prompts * args.samples,
        )
        t0 = time.perf_counter()
        vl = VLLMEngine(model, tok, options)
        start_s = time.perf_counter() - t0
        syncs = [vl.sync_weights() for _ in range(5)]
        engines = {"engine=hf": hf, "engine=vllm": vl}
        if args.server:
            t0 = time.perf_counter()
            engines["vllm server"] = VLLMEngine(model, tok, options, driver=server_driver("auto", 3600, model, options))
            server_s = time.perf_counter() - t0
            server_syncs = [engines["vllm server"].sync_weights() for _ in range(5)]
            print(
                f"  {name}: vLLM server start {server_s:.1f} s, weight push "
                f"{min(server_syncs) * 1000:.0f}-{max(server_syncs) * 1000:.0f} ms"
            )
        if args.sync_only:
            print(f"  {name}: vLLM start {start_s:.1f} s, weight sync {min(syncs):.2f}-{max(syncs):.2f} s")
            continue

        def run(engine):
            batch = engine.generate(prompts, params, n=args.samples, generator=torch.Generator().manual_seed(1))
            return int(batch.completion_lengths.sum())

        results = race({label: lambda e=engine: run(e) for label, engine in engines.items()}, args.repeats)
        base = results["engine=hf"][1] / results["engine=hf"][0]
        print(f"  {name}: vLLM start {start_s:.1f} s, weight sync {min(syncs) * 1000:.0f}-{max(syncs) * 1000:.0f} ms")
        for label, (seconds, tokens) in results.items():
            rate = tokens / seconds
            print(
                f"  {name:4s} {label:12s} {seconds:7.2f} s  {tokens:6d} tokens  {rate:8.0f} tok/s  x{rate / base:.2f}"
            )
        if args.server:
            engines["vllm server"].driver.close()
        vl = engines = None  # release the engines before the next dtype starts its own


if __name__ == "__main__":
    main()
