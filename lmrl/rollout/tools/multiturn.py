"""The multi-turn rollout loop: model turns from any engine, environment steps in between, one token sequence.

    batch = run_episodes(engine, tokenizer, envs, rows, params, MultiTurnOptions(max_turns=4), generator)

Each trajectory is one row of a `RolloutBatch`: the prompt (the environment's first messages rendered by
the chat template, with its tools) and a completion that holds every assistant turn as sampled (tokens
and sampler log-probs kept, never re-tokenized) and, between turns, the tokens of the environment's
messages as the chat template renders them. `completion_mask` is 1 on all of them (the learner attends to
tool outputs); `loss_mask` is 1 only on sampled tokens, minus the tool-call tokens when
`train_tool_calls` is off. So every policy loss, KL and TIS of `lmrl rl` applies unchanged.

An episode ends when the environment says done, after `max_turns` assistant turns, when a turn hits
`params.max_new_tokens` without its end-of-turn token, or when the completion would pass
`max_total_tokens` or the model's context length (it is cut there); all but the first are flagged `truncated`. A cut turn is still given to
the environment (its reward counts; its observations are dropped). `info[i]` keeps the
turn spans (`turns`: the assistant's, `env_spans`: (role, start, end) of the environment's messages, in
completion tokens), the full conversation (`messages`) and transcript, the finish reason and the environment reward.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from typing import Any

import torch

from lmrl.data.chat import special_strings
from lmrl.data.tool_chat import (
    between_turns_ids,
    observations_with_special_tokens,
    prompt_ids,
    render,
    span_token_mask,
)
from lmrl.rollout.engines.assemble import left_pad
from lmrl.rollout.tools.env import Environment
from lmrl.rollout.types import RolloutBatch, SamplingParams

FINISHES = ("done", "max_turns", "turn_length", "budget")


@dataclasses.dataclass(frozen=True)
class MultiTurnOptions:
    max_turns: int = 4
    """assistant turns per episode"""
    max_total_tokens: int = 256
    """token budget of the whole completion (assistant turns + environment messages)"""
    train_tool_calls: bool = True
    """learn the tokens of tool calls (False: mask them like tool outputs)"""
    parser: Any = None
    """the ToolParser that finds call spans when train_tool_calls is False"""

    def __post_init__(self) -> None:
        if self.max_turns < 1 or self.max_total_tokens < 1:
            raise ValueError(
                f"max_turns and max_total_tokens must be >= 1, got {self.max_turns}, {self.max_total_tokens}."
            )


@dataclasses.dataclass
class _Trajectory:
    env: Environment
    history: list[dict]
    prompt: list[int]
    ids: list[int] = dataclasses.field(default_factory=list)
    train: list[float] = dataclasses.field(default_factory=list)
    logp: list[float] = dataclasses.field(default_factory=list)
    turns: list[tuple[int, int]] = dataclasses.field(default_factory=list)
    env_spans: list[tuple[str, int, int]] = dataclasses.field(default_factory=list)
    reward: float = 0.0
    finish: str | None = None
    final: str = ""
    special_outputs: int = 0
    """observations that held special-token strings, tokenized as plain text (`between_turns_ids`)"""


def run_episodes(
    engine,
    tokenizer,
    envs: Sequence[Environment],
    rows: Sequence[dict],
    params: SamplingParams,
    options: MultiTurnOptions,
    generator: torch.Generator | None = None,
    group_size: int = 1,
) -> RolloutBatch:
    """Run one episode per environment (`envs[i]` on `rows[i]`, prompt-major groups of `group_size`)."""
    if len(envs) != len(rows) or not envs:
        raise ValueError(f"run_episodes: got {len(envs)} environments for {len(rows)} rows; give one per row.")
    trajs = []
    for env, row in zip(envs, rows):
        history = env.reset(row)
        trajs.append(_Trajectory(env, history, prompt_ids(tokenizer, history, env.tools)))
    limit = getattr(getattr(engine.model, "config", None), "max_position_embeddings", None)  # the model's context
    for turn in range(options.max_turns):
        for t in trajs:  # a context the model cannot extend ends the episode (flagged like the token budget)
            if t.finish is None and limit is not None and len(t.prompt) + len(t.ids) >= limit:
                t.finish = "budget"
        active = [t for t in trajs if t.finish is None]
        if not active:
            break
        room = max(options.max_total_tokens - len(t.ids) for t in active)
        if limit is not None:
            room = min(room, limit - max(len(t.prompt) + len(t.ids) for t in active))
        turn_params = dataclasses.replace(params, max_new_tokens=min(params.max_new_tokens, room))
        batch = engine.generate([t.prompt + t.ids for t in active], turn_params, n=1, generator=generator)
        lengths = batch.completion_lengths.tolist()
        for k, traj in enumerate(active):
            ids = batch.completion_ids[k, : lengths[k]].tolist()
            logp = batch.sampler_logp[k, : lengths[k]].tolist()
            _add_turn(traj, tokenizer, ids, logp, batch.completions[k], batch.finish_reason[k] == "length", options)
            if traj.finish is None:
                _step(traj, tokenizer, batch.completions[k], options, last_turn=turn == options.max_turns - 1)
            else:  # cut by the budget or the turn length: the environment still scores the partial turn
                assistant = {"role": "assistant", "content": batch.completions[k]}
                traj.reward += float(traj.env.step(assistant).reward)
                traj.history.append(assistant)
    return _assemble(trajs, tokenizer, engine, group_size)


def _add_turn(
    traj: _Trajectory,
    tokenizer,
    ids: list[int],
    logp: list[float],
    text: str,
    hit_limit: bool,
    options: MultiTurnOptions,
) -> None:
    room = options.max_total_tokens - len(traj.ids)
    if len(ids) > room:  # the budget cuts this turn
        ids, logp, traj.finish = ids[:room], logp[:room], "budget"
    train = [1.0] * len(ids)
    if not options.train_tool_calls and options.parser is not None and ids:
        decoded = tokenizer.decode(ids, skip_special_tokens=True)
        masked = span_token_mask(tokenizer, ids, options.parser.parse(decoded).spans)
        train = [0.0 if m else 1.0 for m in masked]
    start = len(traj.ids)
    traj.ids += ids
    traj.train += train
    traj.logp += logp
    traj.turns.append((start, len(traj.ids)))
    traj.final = text
    if traj.finish is None and hit_limit:
        traj.finish = "turn_length"


def _step(traj: _Trajectory, tokenizer, text: str, options: MultiTurnOptions, last_turn: bool) -> None:
    assistant = {"role": "assistant", "content": text}
    result = traj.env.step(assistant)
    traj.reward += float(result.reward)
    if result.done:
        traj.finish = "done"
        traj.history.append(assistant)
        return
    if last_turn:
        traj.finish = "max_turns"
        traj.history += [assistant, *result.observations]
        return
    between = between_turns_ids(tokenizer, traj.history, assistant, result.observations, traj.env.tools)
    traj.special_outputs += observations_with_special_tokens(result.observations, special_strings(tokenizer))
    traj.history += [assistant, *result.observations]
    room = options.max_total_tokens - len(traj.ids)
    if len(between) >= room:  # no room left for the observation and a reply: cut, flag, stop
        between, traj.finish = between[:room], "budget"
    traj.env_spans.append(
        (
            "+".join(dict.fromkeys(m.get("role", "tool") for m in result.observations)),
            len(traj.ids),
            len(traj.ids) + len(between),
        )
    )
    traj.ids += between
    traj.train += [0.0] * len(between)
    traj.logp += [0.0] * len(between)


def _assemble(trajs: list[_Trajectory], tokenizer, engine, group_size: int) -> RolloutBatch:
    pad = tokenizer.pad_token_id
    n = len(trajs)
    w = max(1, max(len(t.ids) for t in trajs))
    prompt, prompt_mask = left_pad([t.prompt for t in trajs], pad, torch.device("cpu"))  # (N, P) each
    ids = torch.full((n, w), pad, dtype=torch.long)
    attn = torch.zeros(n, w)
    train = torch.zeros(n, w)
    logp = torch.zeros(n, w)
    for i, t in enumerate(trajs):
        if t.ids:
            ids[i, : len(t.ids)] = torch.tensor(t.ids)
            attn[i, : len(t.ids)] = 1
            train[i, : len(t.ids)] = torch.tensor(t.train)
            logp[i, : len(t.ids)] = torch.tensor(t.logp)
    device = engine.device
    truncated = torch.tensor([t.finish != "done" for t in trajs])
    info = [
        {
            "finish": t.finish,
            "turns": t.turns,
            "env_spans": t.env_spans,
            "messages": t.history,
            "num_turns": len(t.turns),
            "env_reward": t.reward,
            "transcript": render(tokenizer, t.history, t.env.tools, add_generation_prompt=False)[
                len(render(tokenizer, t.history[: _first_reply(t.history)], t.env.tools, True)) :
            ],
            "stats": {**dict(getattr(t.env, "stats", {}) or {}), "output_special_tokens": t.special_outputs},
        }
        for t in trajs
    ]
    return RolloutBatch(
        prompt_ids=prompt.to(device),
        prompt_mask=prompt_mask.to(device),
        completion_ids=ids.to(device),
        completion_mask=attn.to(device),
        sampler_logp=logp.to(device),
        truncated=truncated.to(device),
        finish_reason=["length" if x else "stop" for x in truncated.tolist()],
        prompts=[tokenizer.decode(t.prompt, skip_special_tokens=False) for t in trajs],
        completions=[t.final for t in trajs],
        group_size=group_size,
        loss_mask=train.to(device),
        info=info,
    )


def _first_reply(history: list[dict]) -> int:
    """Index of the first assistant message (the transcript starts there)."""
    return next((i for i, m in enumerate(history) if m["role"] == "assistant"), len(history))
