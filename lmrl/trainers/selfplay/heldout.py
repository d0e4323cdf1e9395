"""Self-play's held-out evaluation: the Solver's greedy accuracy on a built-in task's test rows (``eval_dataset``)
and the exact probability of their reference answers, a measure without sampling noise."""

from __future__ import annotations

import torch

from lmrl.data.chat import IGNORE_INDEX
from lmrl.data.sft import SFTExample, build_sft_examples, collate_sft
from lmrl.eval.generation import task_accuracy
from lmrl.models import autocast
from lmrl.models.hf_compat import no_cache
from lmrl.models.logprobs import selective_log_softmax
from lmrl.trainers.selfplay.config import SelfPlayConfig


@torch.no_grad()
def answer_probability(
    model, examples: list[SFTExample], pad_id: int, temperature: float, dtype, batch_size: int = 64
) -> float:
    """mean_i pi(y_i | x_i) at the sampling temperature, y_i = the reference answer and its end of turn.

    The Solver's exact expected pass@1 on these problems if only the reference form counts (a lower
    bound of its expected reward): a held-out measure without sampling noise.
    """
    device, total = next(model.parameters()).device, 0.0
    for start in range(0, len(examples), batch_size):
        batch = {k: v.to(device) for k, v in collate_sft(examples[start : start + batch_size], pad_id).items()}
        with autocast(device.type, dtype):
            logits = model(
                input_ids=batch["input_ids"], attention_mask=batch["attention_mask"], **no_cache(model)
            ).logits
        targets = batch["labels"][:, 1:]  # (B, L-1): token t+1 is predicted at t
        logp = selective_log_softmax(logits[:, :-1], targets.clamp(min=0), temperature=temperature)  # (B, L-1)
        total += (logp * (targets != IGNORE_INDEX)).sum(dim=1).exp().sum().item()
    return total / len(examples)


def evaluate(model, tokenizer, eval_rows, config: SelfPlayConfig, dtype) -> tuple[dict[str, float], list[dict]]:
    """Held-out Solver: greedy accuracy (task verifier) and the exact probability of the reference answers."""
    if not eval_rows:
        return {}, []
    metrics, samples = task_accuracy(
        model, tokenizer, eval_rows, config.solver_max_new_tokens, dtype, num_samples=config.num_samples
    )
    examples, _ = build_sft_examples(eval_rows, tokenizer, max_length=1024, where=config.eval_dataset)
    prob = answer_probability(model, examples, tokenizer.pad_token_id, config.temperature, dtype)
    return {"eval/accuracy": metrics["accuracy"], "eval/answer_prob": prob}, samples
