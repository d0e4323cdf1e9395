"""``lmrl reward mode=score``: score every completion of a file with a trained reward model, written as JSONL.

lmrl reward mode=score model=runs/reward/final dataset=pairs.jsonl scores_file=scored.jsonl
"""

from __future__ import annotations

import json
from pathlib import Path

from lmrl.data import preference as prefs
from lmrl.data.loading import row_where
from lmrl.models.setup import ModelSetup
from lmrl.rewards.reward_model import score_texts
from lmrl.trainers.reward.config import RewardConfig


def score(config: RewardConfig) -> dict[str, float]:
    """mode=score: every completion of `dataset` scored by the RM at `model`, written as JSONL.

    Pairwise rows get `reward_chosen`/`reward_rejected`, ranked rows `rewards` (one per completion, in the
    file's order), prompt/completion and stepwise rows `reward`. Returns the row count and, for pairs and
    rankings, the RM's pairwise accuracy against the data's order.
    """
    setup = ModelSetup.from_config(config)
    model, tokenizer = setup.reward_model(config.model)
    builtin = config.dataset in prefs.BUILTIN_SOURCES  # a file is scored whole; train_rows sizes built-in data
    rows = prefs.load_preference_rows(
        config.dataset, config.split, config.train_rows if builtin else None, **config.data_args
    )
    prompts, texts, spans = [], [], []  # spans[i]: (first, the row's completions best first or None)
    for i, row in enumerate(rows):
        where = row_where(i, config.dataset)
        if isinstance(row, dict) and ("chosen" in row or "ranking" in row or "scores" in row):
            group = prefs.parse_preference_row(row, where)
            spans.append((len(texts), group.completions))
            prompts += [group.prompt] * group.k
            texts += list(group.completions)
        elif isinstance(row, dict) and "completions" in row:
            (record,) = prefs.parse_step_rows([row], where)
            spans.append((len(texts), None))
            prompts.append(record.prompt)
            texts.append(record.completion)
        elif isinstance(row, dict) and "prompt" in row and "completion" in row:
            spans.append((len(texts), None))
            prompts.append(row["prompt"])
            texts.append(row["completion"])
        else:
            found = sorted(row) if isinstance(row, dict) else type(row).__name__
            raise ValueError(
                f"{where}: mode=score needs prompt+completion, prompt+chosen+rejected or "
                f"prompt+completions columns; found {found}."
            )
    values = score_texts(model, tokenizer, prompts, texts, dtype=setup.dtype)
    out_path = Path(config.scores_file or Path(config.output_dir) / "scores.jsonl")
    out_path.parent.mkdir(parents=True, exist_ok=True)
    correct = pairs = 0
    with out_path.open("w") as f:
        for row, (first, ranked) in zip(rows, spans):
            if ranked is None:
                extra = {"reward": values[first]}
            else:
                v = values[first : first + len(ranked)]  # best first
                pairs += len(v) * (len(v) - 1) // 2
                correct += sum(v[a] > v[b] for a in range(len(v)) for b in range(a + 1, len(v)))
                extra = (
                    {"reward_chosen": v[0], "reward_rejected": v[1]}
                    if "chosen" in row
                    else {"rewards": [v[ranked.index(c)] for c in row["completions"]]}
                )
            f.write(json.dumps({**row, **extra}) + "\n")
    result = {"rows": float(len(rows)), **({"accuracy": correct / pairs} if pairs else {})}
    print(
        f"Scored {len(rows)} rows with {config.model} -> {out_path}"
        + (f"; pairwise accuracy {result['accuracy']:.3f} over {pairs} pairs" if pairs else "")
    )
    return result
