"""Where do tool episodes fail? Greedy episodes of a tool_arithmetic model, split into: called the calculator,
with exactly the right expression, answered with the tool's result, answered correctly.

    PYTHONPATH=. python benchmarks/tool_use_calls.py runs/tool_use/rl-tools-s0/final --digits 2 --rows 100
"""

from __future__ import annotations

import argparse
import json

import torch

from lmrl.data.loading import load_rows
from lmrl.data.tool_chat import ensure_tool_template
from lmrl.eval.tools import episode_scores
from lmrl.models import load_model_and_tokenizer
from lmrl.rollout.engines.hf import HFEngine
from lmrl.rollout.tools.env import tool_env_factory
from lmrl.rollout.tools.multiturn import MultiTurnOptions, run_episodes
from lmrl.rollout.tools.parsers import get_parser
from lmrl.rollout.tools.toolbox import ToolBox, calculate, calculator
from lmrl.rollout.types import SamplingParams


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("model")
    p.add_argument("--digits", type=int, default=2)
    p.add_argument("--rows", type=int, default=100)
    a = p.parse_args()
    torch.set_num_threads(1)
    model, tok = load_model_and_tokenizer(a.model, None, 0)
    ensure_tool_template(tok)
    parser = get_parser("pythonic")
    rows = load_rows("task:tool_arithmetic", split="test", limit=a.rows, digits=a.digits)
    make = tool_env_factory(ToolBox([calculator()]), parser)
    batch = run_episodes(
        HFEngine(model, tok),
        tok,
        [make(r) for r in rows],
        rows,
        SamplingParams(max_new_tokens=48, greedy=True),
        MultiTurnOptions(3, 160, parser=parser),
    )
    scores = episode_scores(batch, rows)
    called = right_call = relayed = 0
    for row, info, answer in zip(rows, batch.info, batch.completions):
        first = parser.parse(info["transcript"].split("<|im_end|>", 1)[0]).calls
        called += bool(first)
        if first and first[0].name == "calculator" and first[0].arguments == {"expression": row["meta"]["expression"]}:
            right_call += 1
            relayed += answer.strip() == calculate(row["meta"]["expression"])
    n = len(rows)
    print(
        json.dumps(
            {
                "model": a.model,
                "episodes": n,
                "called_calculator": called / n,
                "exact_call_arguments": right_call / n,
                "answer_is_tool_result": relayed / n,
                "accuracy": sum(scores) / n,
                "example": batch.info[0]["transcript"],
            }
        )
    )


if __name__ == "__main__":
    main()
