"""`lmrl generate`'s config (`lmrl.generate`), in a module of its own: `lmrl.cli` checks it without importing torch."""

from __future__ import annotations

import dataclasses
from pathlib import Path

from lmrl.config import ConfigError, field
from lmrl.config_base import check_input_file
from lmrl.rollout.engines.section import EngineSection
from lmrl.rollout.tools.section import ToolSection


@dataclasses.dataclass
class GenerateConfig(ToolSection, EngineSection):
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
    chat: bool = field(
        True,
        "apply the tokenizer's chat template (ChatML when it has none); false: the raw text with the tokenizer's own special tokens (a base model's BOS)",
    )
    chat_template: str | None = field(
        None, "the model's chat template: a Jinja string, a file holding one, or chatml; null: the tokenizer's own"
    )
    prompt_template: str | None = field(None, "a template holding {prompt} that each prompt is put into first")
    seed: int = field(0, "sampling seed")
    precision: str = field("auto", "auto | bf16 | fp32")
    best_of: int = field(1, "best-of-N: sample N completions per prompt, keep the best by `rewards` (1: off)")
    rewards: list[str] = field([], "best_of: reward functions (model:PATH, a registry name, module:function)")
    reward_weights: list[float] = field([], "best_of: one weight per reward (default 1.0 each)")
    reward_kwargs: dict = field({}, "best_of: options per reward name")
    kl_samples: int = field(
        0,
        "best_of: extra samples per prompt, scored but never shown, that enlarge the pool of the empirical KL estimate",
    )
    output_file: str | None = field(
        None, "also write the completions (best_of: the chosen ones, with rewards) as JSONL"
    )

    def __post_init__(self) -> None:
        super().__post_init__()
        if self.prompts_file:
            check_input_file("prompts_file", self.prompts_file)
        if self.multi_turn and (self.best_of > 1 or not self.chat):
            raise ConfigError("tools/env run the multi-turn tool loop, which needs chat=true and best_of=1.")
        if self.n < 1 or self.max_new_tokens < 1:
            raise ConfigError("'n' and 'max_new_tokens' must be >= 1.")
        if self.temperature < 0:
            raise ConfigError(f"'temperature' must be >= 0 (0 is greedy), got {self.temperature}.")
        if self.best_of < 1:
            raise ConfigError(
                f"'best_of' (N) must be >= 1, got {self.best_of}; best_of=1 samples once, "
                "best_of=N samples N completions per prompt and keeps the best by `rewards`."
            )
        if self.kl_samples < 0:
            raise ConfigError(f"'kl_samples' must be >= 0, got {self.kl_samples}.")
        if self.best_of > 1:
            if not self.rewards:
                raise ConfigError(
                    "best_of > 1 needs rewards to pick the best completion, e.g. "
                    "rewards=model:runs/reward/final (a reward model) or rewards=mypkg.rewards:score."
                )
            if self.n != 1:
                raise ConfigError(
                    f"best_of returns one completion per prompt; got n={self.n}. Drop n "
                    "(or use best_of=1 to see n raw samples)."
                )
            if self.temperature == 0:
                raise ConfigError(
                    "best_of > 1 needs sampling (temperature > 0): greedy decoding gives N identical completions."
                )
        if self.reward_weights and len(self.reward_weights) != len(self.rewards):
            raise ConfigError(f"reward_weights has {len(self.reward_weights)} entries for {len(self.rewards)} rewards.")

    def all_prompts(self) -> list[str]:
        prompts = list(self.prompts)
        if self.prompts_file:
            path = Path(self.prompts_file).expanduser()
            check_input_file("prompts_file", self.prompts_file)
            data = path.read_bytes()
            try:
                text = data.decode("utf-8")
            except UnicodeDecodeError as exc:  # was: the codec's message, naming no file
                line = data[: exc.start].count(b"\n") + 1
                raise ConfigError(
                    f"'prompts_file' {self.prompts_file!r} is not UTF-8 text: byte {exc.start} (line {line}) is "
                    f"{data[exc.start : exc.start + 1]!r}. Convert it, e.g. iconv -f latin1 -t utf-8 FILE > FILE.utf8."
                ) from None
            prompts += [line for line in text.splitlines() if line.strip()]
        if not prompts:
            raise ConfigError("No prompts: give prompts='[\"...\"]' or prompts_file=PATH.")
        return prompts
