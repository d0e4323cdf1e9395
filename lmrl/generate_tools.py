"""`lmrl generate tools=[...]`: run the tool loop on prompts and show each transcript.

    lmrl generate model=runs/sft-tools/final prompts='["4821*9375="]' tools=[calculator] tool_parser=pythonic
"""

from __future__ import annotations

import torch
from rich.table import Table

from lmrl.rollout.multiturn import run_episodes
from lmrl.rollout.tool_config import build_env_factory
from lmrl.tracking import console


def run_tool_episodes(config, engine, tokenizer, params, prompts: list[str]) -> list[list[str]]:
    """n episodes per prompt; returns the final answers grouped per prompt (transcripts are printed/written)."""
    make_env = build_env_factory(config, tokenizer)
    rows = [{"prompt": p} for p in prompts for _ in range(config.n)]
    batch = run_episodes(engine, tokenizer, [make_env(r) for r in rows], rows, params, config.turn_options(),
                         torch.Generator().manual_seed(config.seed), group_size=config.n)
    table = Table(title=f"{config.model} with tools {config.tools + config.mcp_servers}", show_lines=True)
    for column in ("prompt", "transcript", "turns", "tool calls", "finish"):
        table.add_column(column, overflow="fold")
    for k, info in enumerate(batch.info):
        table.add_row(rows[k]["prompt"] if k % config.n == 0 else "", info["transcript"], str(info["num_turns"]),
                      f"{info['stats'].get('calls', 0)} ({info['stats'].get('call_errors', 0)} errors)", info["finish"])
    console.print(table)
    if config.output_file:
        from lmrl.generate import write_jsonl

        write_jsonl(config.output_file, [{"prompt": r["prompt"], "completion": c, "transcript": i["transcript"],
                                          "finish": i["finish"], "tool_stats": i["stats"]}
                                         for r, c, i in zip(rows, batch.completions, batch.info)])
    return [batch.completions[i * config.n : (i + 1) * config.n] for i in range(len(prompts))]
