"""Rollout throughput: lmrl `HFEngine.generate` vs HF `model.generate(do_sample=True)`; with --engines, lmrl's two
engines (`engine=hf` vs `engine=vllm`, `benchmarks/engine_speed.py`).

Same random ~10M-parameter Llama-style model, same prompts, same n and max_new_tokens, fp32 and bf16
autocast. Tokens/s counts real completion tokens (up to and including the stop token).

    python benchmarks/rollout_speed.py                      # 16 prompts x 8 samples x 64 new tokens
    python benchmarks/rollout_speed.py --eos-bias 4         # rows stop early: measures batch compaction too
    python benchmarks/rollout_speed.py --engines --model medium    # HFEngine vs VLLMEngine, 128 x 256 (needs vLLM)

By default no stop token is ever sampled (every row is 64 tokens), so both sides do identical work;
with --eos-bias the eos logit is raised so that completion lengths vary.
"""

from __future__ import annotations

import argparse
import contextlib
import time

import torch
from transformers import LlamaConfig, LlamaForCausalLM

from lmrl.rollout import HFEngine, SamplingParams

EOS, PAD = 2, 0


class _IdTokenizer:
    """The minimum HFEngine needs from a tokenizer, over integer ids (text is the ids joined by spaces)."""

    pad_token_id, eos_token_id = PAD, EOS

    def __init__(self, vocab: int):
        self.vocab = vocab

    def __len__(self) -> int:
        return self.vocab

    def batch_decode(self, seqs, skip_special_tokens: bool = False):
        return [" ".join(str(t) for t in s if not (skip_special_tokens and t in (PAD, EOS))) for s in seqs]


def build_model(vocab: int, eos_bias: float, seed: int = 0) -> LlamaForCausalLM:
    torch.manual_seed(seed)
    config = LlamaConfig(
        vocab_size=vocab,
        hidden_size=256,
        num_hidden_layers=6,
        num_attention_heads=4,
        num_key_value_heads=4,
        intermediate_size=1024,
        max_position_embeddings=512,
        pad_token_id=PAD,
        eos_token_id=EOS,
        bos_token_id=1,
    )
    model = LlamaForCausalLM(config).eval()
    if eos_bias:

        def raise_eos(module, inputs, logits):  # +eos_bias on the eos logit, for both engines alike
            return logits.index_add(
                -1, torch.tensor([EOS]), torch.full((*logits.shape[:-1], 1), eos_bias, dtype=logits.dtype)
            )

        model.lm_head.register_forward_hook(raise_eos)
    return model


def race(contenders: dict, repeats: int) -> dict:
    """Best-of-`repeats` seconds and the result of each contender; runs are interleaved so that load from
    other processes on the machine hits every contender alike."""
    for fn in contenders.values():
        fn()  # warm-up
    best = {name: (float("inf"), None) for name in contenders}
    for _ in range(repeats):
        for name, fn in contenders.items():
            start = time.perf_counter()
            out = fn()
            seconds = time.perf_counter() - start
            if seconds < best[name][0]:
                best[name] = (seconds, out)
    return best


def main() -> None:
    import sys

    if "--engines" in sys.argv:  # lmrl's HF engine vs its vLLM engine
        from engine_speed import main as engines_main

        sys.argv.remove("--engines")
        return engines_main()
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--prompts", type=int, default=16)
    parser.add_argument("--samples", type=int, default=8)
    parser.add_argument("--new-tokens", type=int, default=64)
    parser.add_argument("--prompt-len", type=int, nargs=2, default=(16, 48), help="min and max prompt length")
    parser.add_argument("--vocab", type=int, default=128)
    parser.add_argument("--eos-bias", type=float, default=0.0, help="0: rows never stop; >0: rows stop early")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--threads", type=int, default=0, help="torch threads (0: leave as is)")
    args = parser.parse_args()
    if args.threads:
        torch.set_num_threads(args.threads)

    model = build_model(args.vocab, args.eos_bias)
    n_params = sum(p.numel() for p in model.parameters())
    gen = torch.Generator().manual_seed(0)
    lengths = torch.randint(args.prompt_len[0], args.prompt_len[1] + 1, (args.prompts,), generator=gen).tolist()
    prompts = [torch.randint(3, args.vocab, (n,), generator=gen).tolist() for n in lengths]
    stop = (EOS,) if args.eos_bias > 0 else ()
    params = SamplingParams(max_new_tokens=args.new_tokens, temperature=1.0, stop_token_ids=stop)

    width = max(lengths)
    ids = torch.full((args.prompts, width), PAD)
    mask = torch.zeros(args.prompts, width, dtype=torch.long)
    for i, p in enumerate(prompts):
        ids[i, width - len(p) :], mask[i, width - len(p) :] = torch.tensor(p), 1

    print(
        f"model {n_params / 1e6:.1f}M params, {torch.get_num_threads()} threads; "
        f"{args.prompts} prompts x {args.samples} samples x {args.new_tokens} new tokens, prompt len {lengths and (min(lengths), max(lengths))}"
    )
    for dtype in (None, torch.bfloat16):
        name = "fp32" if dtype is None else "bf16"
        ctx = (lambda: torch.autocast("cpu", dtype=dtype)) if dtype is not None else contextlib.nullcontext

        def run_hf():
            with torch.no_grad(), ctx():  # generate() itself runs under no_grad
                out = model.generate(
                    input_ids=ids,
                    attention_mask=mask,
                    do_sample=True,
                    num_return_sequences=args.samples,
                    max_new_tokens=args.new_tokens,
                    top_k=None,
                    top_p=None,
                    temperature=1.0,
                    pad_token_id=PAD,
                    eos_token_id=EOS if stop else None,
                )
            completion = out[:, width:]  # (N, T)
            if not stop:
                return completion.numel()
            is_eos = completion == EOS
            first = torch.where(is_eos.any(1), is_eos.float().argmax(1) + 1, completion.shape[1])
            return int(first.sum())

        contenders = {}
        for label, compact in (("lmrl", 0.5), ("lmrl-nocompact", None)):
            if label == "lmrl-nocompact" and not stop:
                continue  # nothing finishes early: compaction never triggers
            engine = HFEngine(model, _IdTokenizer(args.vocab), autocast_dtype=dtype, compact_threshold=compact)
            contenders[label] = lambda engine=engine: int(
                engine.generate(
                    prompts, params, n=args.samples, generator=torch.Generator().manual_seed(1)
                ).completion_lengths.sum()
            )
        contenders["hf.generate"] = run_hf
        results = race(contenders, args.repeats)
        base = results["hf.generate"][1] / results["hf.generate"][0]
        for label, (seconds, tokens) in results.items():
            rate = tokens / seconds
            print(
                f"  {name:4s} {label:15s} {seconds * 1000:8.0f} ms  {tokens:6d} tokens  {rate:8.0f} tok/s  x{rate / base:.2f}"
            )


if __name__ == "__main__":
    main()
