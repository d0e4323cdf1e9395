"""Greedy held-out accuracy of the zero-RL run's start and final models (experiments/zero/seed0.json), with the run's
prompt format and stop strings: .venv/bin/python experiments/zero/evaluate.py (after the recipe ran with seed=0
output_dir=runs/zero/seed0)."""

import json

import torch

from lmrl.config import load_config
from lmrl.data.prompt_format import PromptFormat
from lmrl.eval.generation import task_accuracy
from lmrl.models.loading import load_model_and_tokenizer
from lmrl.trainers.rl import trainer as online
from lmrl.trainers.rl.prompts import load_prompts

config = load_config(online.RLConfig, "rl/smollm2_zero_grpo", ["output_dir=/tmp/zero_eval_unused"])
_, eval_rows = load_prompts(config)
out = {}
for name, path in (("start", config.model), ("final", "runs/zero/seed0/final")):
    model, tok = load_model_and_tokenizer(path, chat=False)
    acc, samples = task_accuracy(
        model.eval(),
        tok,
        eval_rows,
        config.max_new_tokens,
        torch.bfloat16,
        num_samples=3,
        prompt_format=PromptFormat.from_config(config),
        stop_strings=tuple(config.stop),
    )
    out[name] = acc["accuracy"]
    print(name, acc, [s["completion"] for s in samples], flush=True)
print(json.dumps(out))
