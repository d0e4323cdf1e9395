"""The rules between config keys, as one table: what a setting needs and what it excludes, with the message and its fix.

A rule reads ``when`` holds, ``needs`` must hold too and ``excludes`` must not, e.g. ``placement=ray`` needs
``engine=hf``. Each side is a list of conditions on one key or property each::

    curriculum!=null     set (not null)          stop            true, non-empty or non-zero
    placement=ray        equal (a|b: any of)     engine!=hf      not equal
    samples_per_prompt>=2, nproc>1, ...          compared as numbers

Every config checks the rules whose ``when`` keys it has, and of their ``needs`` and ``excludes`` the conditions on
keys it has (a key a verb does not have cannot conflict): `lmrl.config_base.Section` raises the message of
`broken_rule` once the sections checked their own keys. The message is formatted with the config's values
(``{engine}``) and ``{got}``, the offending condition as it is set (``nproc=2``; ``{keys}``: its key alone). A rule
that one verb alone can break stays in that verb's config, beside its other checks. This module imports nothing of
lmrl (`lmrl.config_base` reads it).
"""

from __future__ import annotations

import dataclasses
import functools
import re
import typing
from typing import Any, Literal, get_origin

CONDITION = re.compile(r"^(\w+)\s*(!=|>=|<=|=|>|<)?\s*(.*)$")


@dataclasses.dataclass(frozen=True)
class Rule:
    """``when`` (all of them) holds: each of ``needs`` must hold and none of ``excludes``, or ``message``."""

    when: tuple[str, ...]
    message: str
    needs: tuple[str, ...] = ()
    excludes: tuple[str, ...] = ()


def rule(when: str | tuple[str, ...], message: str, needs: str | tuple = (), excludes: str | tuple = ()) -> Rule:
    def listed(conditions: str | tuple) -> tuple[str, ...]:
        return (conditions,) if isinstance(conditions, str) else tuple(conditions)

    return Rule(listed(when), message, listed(needs), listed(excludes))


SAMPLES_AHEAD = (
    "samples ahead while the learner trains: on Ray rollout workers (placement=ray) or on vLLM servers (engine=vllm "
    "vllm_server=host:port, vllm_servers=[...] or vllm_replicas=N)"
)

RULES: list[Rule] = [
    # the model and its processes
    rule("merge_lora", "merge_lora=true needs LoRA (lora_r > 0).", needs="lora_r>0"),
    rule(
        ("lora_r>0", "processes>1"),
        "LoRA with several processes runs with parallel=ddp (the adapters are small; the frozen base is not "
        "sharded). Fix: add parallel=ddp.",
        excludes="parallel=fsdp",
    ),
    rule(
        "max_tokens_per_microbatch!=null",
        "max_tokens_per_microbatch={max_tokens_per_microbatch} packs rows into micro-batches of that many tokens: it "
        "replaces grad_accum (got grad_accum={grad_accum}). Fix: grad_accum=1.",
        needs="grad_accum=1",
    ),
    rule(
        "stop_at_accuracy!=null",
        "stop_at_accuracy={stop_at_accuracy} needs a value in (0, 1] and eval_every > 0 (got eval_every="
        "{eval_every}): accuracy is checked at each evaluation.",
        needs=("stop_at_accuracy>0", "stop_at_accuracy<=1", "eval_every>0"),
    ),
    # the rollout engine and its servers
    rule(
        "stop",
        "'stop' strings are applied by engine=hf only (the vLLM engine samples token ids). Fix: engine=hf, or end "
        "completions with the model's own stop tokens.",
        excludes="engine=vllm",
    ),
    rule(
        "vllm_servers!=null",
        "vllm_server={vllm_server!r} and vllm_servers={vllm_servers} both name the vLLM servers. Fix: one of them "
        "(vllm_servers=[host:port] is the same as vllm_server=host:port).",
        excludes="vllm_server!=null",
    ),
    rule(
        "vllm_servers!=null",
        "vllm_servers samples with vLLM, but engine={engine}. Fix: engine=vllm, or vllm_servers=null.",
        needs="engine=vllm",
    ),
    rule(
        "vllm_replicas!=null",
        "vllm_replicas={vllm_replicas} starts the servers and {got} names them. Fix: one of them (vllm_replicas=1 is "
        "vllm_server=auto; running servers go in vllm_servers).",
        excludes=("vllm_servers!=null", "vllm_server!=null"),
    ),
    rule(
        "vllm_replicas!=null",
        "vllm_replicas samples with vLLM, but engine={engine}. Fix: engine=vllm, or vllm_replicas=null.",
        needs="engine=vllm",
    ),
    rule(
        "vllm_weight_transport!=http",
        "vllm_weight_transport={vllm_weight_transport} sets how weights reach vLLM servers, but this run samples "
        "with vLLM in its own process (weights loaded in place) or with engine=hf. Fix: vllm_weight_transport=http, "
        "or a server (vllm_server, vllm_servers or vllm_replicas).",
        needs="servers",
    ),
    rule(
        "vllm_lora_sync=adapter",
        "vllm_lora_sync=adapter loads the adapters from files this process writes, into vLLM in this process: it "
        "runs colocated on one process (got {got}). Fix: vllm_lora_sync=merged (any mode), or no vllm_server and "
        "nproc=1.",
        excludes=("servers", "nproc>1"),
    ),
    # lmrl rl: the data order, where rollouts run, and sampling ahead
    rule(
        "advantage=rloo|grpo|dr_grpo",
        "{algorithm} needs samples_per_prompt >= 2 (got {samples_per_prompt}): its baseline is the other samples of "
        "the same prompt. Use samples_per_prompt=8, or algorithm=reinforce (batch-mean baseline) for one sample per "
        "prompt.",
        needs="samples_per_prompt>=2",
    ),
    rule(
        "curriculum!=null",
        "curriculum (the data order depends on every rank's rewards) does not run on several processes yet "
        "(docs/scale.md). Fix: nproc=1.",
        excludes="processes>1",
    ),
    rule(
        "dynamic_sampling=refill",
        "dynamic_sampling=refill replaces groups whose samples_per_prompt rewards are all equal; with "
        "samples_per_prompt=1 every group is. Fix: samples_per_prompt >= 2.",
        needs="samples_per_prompt>=2",
    ),
    rule(
        "dynamic_sampling=refill",
        "dynamic_sampling=refill draws more prompts of the data stream during a step, which {got} cannot serve: "
        "sampling ahead (placement=ray, async_steps) and a curriculum (it orders the data by the steps' rewards) "
        "have no refill rounds yet. Fix: dynamic_sampling=drop, or placement=local and async_steps=0 without "
        "curriculum.",
        excludes=("placement=ray", "async_steps>0", "curriculum!=null"),
    ),
    rule(
        "samples_ahead",
        "placement=ray and async_steps sample ahead in the fixed data order, for one learner process, single-turn "
        "(got {got}). Fix: nproc=1, no tools/environment and no curriculum (or placement=local and async_steps=0).",
        excludes=("curriculum!=null", "processes>1", "multi_turn"),
    ),
    rule(
        "placement=ray",
        "placement=ray runs one learner process with engine=hf single-turn rollout workers (got engine={engine}). "
        "Fix: engine=hf (or placement=local).",
        needs="engine=hf",
    ),
    rule(
        ("async_steps>0", "placement=local"),
        "async_steps={async_steps} " + SAMPLES_AHEAD + "; engine=hf samples in the learner's process, with the "
        "learner's weights. Fix: async_steps=0, placement=ray, or a vLLM server.",
        needs="engine=vllm",
    ),
    rule(
        ("async_steps>0", "placement=local"),
        "async_steps={async_steps} " + SAMPLES_AHEAD + "; engine=vllm without a server samples in the learner's "
        "process, with the learner's weights. Fix: async_steps=0, placement=ray, or a vLLM server.",
        needs="servers",
    ),
    rule(
        "async_steps>0",
        "async_steps > 0 corrects stale samples with the importance weight against the sampler's log-probs: it "
        "needs tis_cap set, one update per step (ppo_epochs=minibatches=1) and no value model (got {got}). Fix: "
        "async_steps=0 or those keys (is_mode=off turns the correction off explicitly, for ablations; docs/async.md).",
        needs=("tis_cap!=null", "updates_per_step=1", "advantage!=gae"),
    ),
    rule(
        "async_abort_on_push",
        "async_abort_on_push re-sends requests queued on vLLM servers ahead of a weight push: it applies to "
        "async_steps > 0 with engine=vllm and vllm_server(s) (got {got}). Fix: async_abort_on_push=false, or "
        "async_steps on vLLM servers.",
        needs="async_steps>0",
        excludes="placement=ray",
    ),
    # lmrl rl: the loss and its correction
    rule(
        "kl_target!=null",
        "kl_target={kl_target} adapts kl_coef from its start value: it needs kl_target > 0 and kl_coef > 0 (got "
        "kl_coef={kl_coef}), e.g. kl_coef=0.05 kl_target=0.1.",
        needs=("kl_target>0", "kl_coef>0"),
    ),
    rule(
        "tis_cap=null",
        "{keys} shape the importance weight that tis_cap turns on, but tis_cap=null. Fix: tis_cap=2.0 (the upper "
        "bound), or leave {keys} at the default.",
        excludes=("is_level!=token", "is_mode!=truncate", "is_low!=null"),
    ),
    rule(
        "ptx_coef>0",
        "ptx_coef={ptx_coef} needs pretraining text: ptx_dataset=builtin:pydoc, a .txt file or a dataset with a text "
        "column.",
        needs="ptx_dataset",
    ),
]


def broken_rule(config: Any, rules: typing.Sequence[Rule] = RULES) -> str | None:
    """The message of the first rule of ``rules`` that ``config`` breaks, or None."""
    for r in rules:
        if not all(has(config, c) and holds(config, c) for c in r.when):
            continue
        broken = [c for c in r.needs if has(config, c) and not holds(config, c)]
        broken += [c for c in r.excludes if has(config, c) and holds(config, c)]
        if broken:
            key = parse(broken[0])[0]
            return r.message.format(got=shown(config, key), keys=key, **values(config))
    return None


def parse(condition: str) -> tuple[str, str, str]:
    """``"nproc>1"`` -> ``("nproc", ">", "1")``; a bare name -> ``(name, "", "")``."""
    match = CONDITION.match(condition)
    if match is None:
        raise ValueError(f"not a condition: {condition!r}")
    name, op, text = match.groups()
    return name, op or "", text.strip()


def has(config: Any, condition: str) -> bool:
    """Whether ``config`` has the key (or property) ``condition`` is about."""
    name = parse(condition)[0]
    return name in keys_of(type(config)) or isinstance(getattr(type(config), name, None), property)


@functools.cache
def keys_of(cls: type) -> frozenset[str]:
    return frozenset(f.name for f in dataclasses.fields(cls))


def holds(config: Any, condition: str) -> bool:
    name, op, text = parse(condition)
    value = getattr(config, name)
    if not op:
        return bool(value)
    if op in ("=", "!="):
        equal = any(value == constant(option) for option in text.split("|"))
        return equal if op == "=" else not equal
    number, bound = float(value), float(text)
    return {">": number > bound, "<": number < bound, ">=": number >= bound, "<=": number <= bound}[op]


def constant(text: str) -> Any:
    """A condition's value: null, true/false, a number, or text."""
    if text in ("null", "true", "false"):
        return {"null": None, "true": True, "false": False}[text]
    try:
        return float(text)
    except ValueError:
        return text


def values(config: Any) -> dict[str, Any]:
    """The config's keys and the properties rules name, for a message's placeholders."""
    names = set(keys_of(type(config)))
    names |= {parse(c)[0] for r in RULES for c in (*r.when, *r.needs, *r.excludes) if has(config, c)}
    return {name: getattr(config, name) for name in names}


def shown(config: Any, name: str) -> str:
    """``name=value`` as a user would set it: null, true/false, free text quoted, choices and numbers as they are."""
    value = getattr(config, name)
    if value is None or isinstance(value, bool):
        return f"{name}={'null' if value is None else str(value).lower()}"
    hint = typing.get_type_hints(type(config)).get(name)
    quoted = isinstance(value, str) and get_origin(hint) is not Literal
    return f"{name}={value!r}" if quoted else f"{name}={value}"
