"""``lmrl generate``: sample completions from any model or checkpoint, to look at what it does.

    lmrl generate model=runs/sft/final prompts='["12+34=", "7*8="]' n=4 temperature=0.8
"""

from __future__ import annotations

import dataclasses
from pathlib import Path

import torch
from rich.table import Table

from lmrl.config import ConfigError, field
from lmrl.data.chat import render_prompt
from lmrl.models import autocast_dtype, load_model_and_tokenizer
from lmrl.rollout.hf import HFEngine, SamplingParams
from lmrl.tracking import console


@dataclasses.dataclass
class GenerateConfig:
    model: str = field("builtin:tiny", "HF model path or hub id, a run's final/ or checkpoint dir, or builtin:<size>")
    tokenizer: str | None = field(None, "tokenizer; default: the model's")
    prompts: list[str] = field([], "prompts (chat template applied when chat=true)")
    prompts_file: str | None = field(None, "a text file with one prompt per line (added to prompts)")
    n: int = field(1, "completions per prompt")
    max_new_tokens: int = field(64, "tokens to generate per completion")
    temperature: float = field(1.0, "sampling temperature (0: greedy)")
    top_p: float = field(1.0, "nucleus sampling mass")
    top_k: int = field(0, "sample among the k most likely tokens (0: off)")
    stop: list[str] = field([], "stop strings")
    chat: bool = field(True, "apply the tokenizer's chat template (ChatML when it has none)")
    seed: int = field(0, "sampling seed")
    precision: str = field("auto", "auto | bf16 | fp32")

    def __post_init__(self) -> None:
        if self.n < 1 or self.max_new_tokens < 1:
            raise ConfigError("'n' and 'max_new_tokens' must be >= 1.")
        if self.temperature < 0:
            raise ConfigError(f"'temperature' must be >= 0 (0 is greedy), got {self.temperature}.")

    def all_prompts(self) -> list[str]:
        prompts = list(self.prompts)
        if self.prompts_file:
            path = Path(self.prompts_file)
            if not path.is_file():
                raise FileNotFoundError(f"prompts_file '{path}' does not exist.")
            prompts += [line for line in path.read_text().splitlines() if line.strip()]
        if not prompts:
            raise ConfigError("No prompts: give prompts='[\"...\"]' or prompts_file=PATH.")
        return prompts


def run(config: GenerateConfig) -> list[list[str]]:
    """Prints a table of completions and returns them, grouped per prompt."""
    prompts = config.all_prompts()
    model, tokenizer = load_model_and_tokenizer(config.model, config.tokenizer, config.seed)
    engine = HFEngine(model, tokenizer, autocast_dtype=autocast_dtype(config.precision))
    params = SamplingParams(
        max_new_tokens=config.max_new_tokens, temperature=config.temperature or 1.0, top_p=config.top_p,
        top_k=config.top_k, stop_strings=tuple(config.stop), greedy=config.temperature == 0,
    )
    texts = [render_prompt(tokenizer, p) if config.chat else p for p in prompts]
    ids = [tokenizer(t, add_special_tokens=False)["input_ids"] for t in texts]
    batch = engine.generate(ids, params, n=config.n, generator=torch.Generator().manual_seed(config.seed))
    grouped = [batch.completions[i * config.n : (i + 1) * config.n] for i in range(len(prompts))]
    table = Table(title=f"{config.model}", show_lines=True)
    for column in ("prompt", "completion", "tokens", "finish"):
        table.add_column(column, overflow="fold")
    lengths = batch.completion_lengths.tolist()
    for i, prompt in enumerate(prompts):
        for j, completion in enumerate(grouped[i]):
            k = i * config.n + j
            table.add_row(prompt if j == 0 else "", completion, str(int(lengths[k])), batch.finish_reason[k])
    console.print(table)
    return grouped
