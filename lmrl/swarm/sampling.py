"""Which of its peers' question groups a swarm node trains on: the informative-group filter and samplers.

SAPO (arXiv 2509.08721, section 4): each node "drops zero-advantage groups (all
completions score the same), then samples J uniformly". Rewards are always the
node's own (its verifier re-scores every peer completion); peers send none.

Samplers are registered by name with the signature
``(candidates: list[Candidate], k: int, generator: torch.Generator) -> list[int]``
(indices into `candidates`, at most `k`, no repeats) and are picked with the
node's ``peer_sampling`` option.
"""

from __future__ import annotations

import dataclasses

import torch
from torch import Tensor

from lmrl.algorithms import Registry, zero_variance_groups

PEER_SAMPLERS = Registry("peer sampler")


@dataclasses.dataclass(frozen=True)
class Candidate:
    """One peer question group as the sampler sees it."""

    peer_id: str
    rewards: Tensor
    """(L,) rewards of the group's L completions by this node's verifier."""


def informative(rewards: Tensor) -> bool:
    """True if a group's rewards are not all equal, i.e. its GRPO advantages are not all 0.

    A group with max r == min r has r_i - mean(r) = 0 for every i (and a group of one
    completion always does): it carries no policy-gradient signal (SAPO section 4; DAPO
    dynamic sampling, RLHF book section 7.2.3)."""
    return not bool(zero_variance_groups(rewards, rewards.numel())[0])


def select_peer_groups(name: str, candidates: list[Candidate], k: int, generator: torch.Generator) -> list[int]:
    """Indices of at most `k` distinct candidates chosen by the sampler `name` (see PEER_SAMPLERS)."""
    if isinstance(k, bool) or not isinstance(k, int) or k < 0:
        raise ValueError(f"select_peer_groups: k (the J of SAPO) must be an int >= 0, got {k!r}.")
    fn = PEER_SAMPLERS.get(name)
    if k == 0 or not candidates:
        return []
    chosen = [int(i) for i in fn(candidates, min(k, len(candidates)), generator)]
    if len(set(chosen)) != len(chosen) or len(chosen) > k or any(not 0 <= i < len(candidates) for i in chosen):
        raise ValueError(
            f"peer sampler '{name}' returned {chosen} for {len(candidates)} candidates and k={k}; a sampler must "
            "return at most k distinct indices into the candidate list. Fix the sampler."
        )
    return chosen


@PEER_SAMPLERS.register("uniform")
def _uniform(candidates: list[Candidate], k: int, generator: torch.Generator) -> list[int]:
    """k groups uniformly at random without replacement: the SAPO paper's sampler (section 4) and
    rl-swarm's `random.sample` over valid payloads."""
    return torch.randperm(len(candidates), generator=generator)[:k].tolist()


@PEER_SAMPLERS.register("first")
def _first(candidates: list[Candidate], k: int, generator: torch.Generator) -> list[int]:
    """The first k groups in arrival order (peers sorted by id, groups in payload order): rl-swarm's
    hotfix 1880d95 "filter out bad actors". Deterministic, but favours low peer ids."""
    return list(range(k))


@PEER_SAMPLERS.register("max_variance")
def _max_variance(candidates: list[Candidate], k: int, generator: torch.Generator) -> list[int]:
    """The k groups with the largest reward variance (population variance of the group's rewards),
    ties broken at random: reward-guided sharing, listed as future work in SAPO (section 5).
    For 0/1 rewards the variance p(1-p) is largest for groups that are half right."""
    var = torch.stack([c.rewards.float().var(correction=0) for c in candidates])  # (C,)
    jitter = torch.rand(len(candidates), generator=generator) * 1e-6  # random tie-break below any real gap
    return torch.argsort(var + jitter, descending=True)[:k].tolist()


@PEER_SAMPLERS.register("per_peer")
def _per_peer(candidates: list[Candidate], k: int, generator: torch.Generator) -> list[int]:
    """Round-robin over peers (in random order), uniform within each peer: no peer contributes more than
    ceil(k / number of peers) groups while others still have some, so one flooding peer cannot fill
    the batch (a simple form of the "trust" filtering SAPO lists as future work)."""
    return fair_share([c.peer_id for c in candidates], k, generator)


def fair_share(owners: list[str], k: int, generator: torch.Generator) -> list[int]:
    """Indices of at most ``k`` items, taken round-robin over their owners (in random order) and uniformly within
    each owner: every owner gets ceil(k / owners) slots before any gets more."""
    by_owner: dict[str, list[int]] = {}
    for i, owner in enumerate(owners):
        by_owner.setdefault(owner, []).append(i)
    order = [sorted(by_owner)[i] for i in torch.randperm(len(by_owner), generator=generator).tolist()]
    queues = {
        p: [by_owner[p][j] for j in torch.randperm(len(by_owner[p]), generator=generator).tolist()] for p in order
    }
    chosen: list[int] = []
    k = min(k, len(owners))
    while len(chosen) < k:  # ends: k <= len(owners), and each pass takes >= 1 while any queue is non-empty
        for p in order:
            if queues[p] and len(chosen) < k:
                chosen.append(queues[p].pop(0))
    return chosen
