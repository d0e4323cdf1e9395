"""Metric names of `lmrl eval` and of a trainer's `eval_metrics`, parsed into what to run.

accuracy        greedy decoding, scored by the row's verifier (pass@1 of the greedy answer)
pass@K          unbiased pass@k from n >= K samples per prompt (Chen et al. 2021)
pass^K          all K trials succeed (τ-bench), from the same samples
maj@K           majority vote of the first K samples
avg@K           mean score over K samples per prompt, with the std over the K sample indices
reward          mean reward-model score of the greedy answers (needs reward_model=PATH)
win_rate        pairwise judge vs a baseline model's greedy answers, plain and length-controlled
                (needs judge=PATH and baseline=PATH)
loglik          multiple choice by log-likelihood, summed and length-normalised (needs a `choices` column)
"""

from __future__ import annotations

import difflib
import re
from dataclasses import dataclass, field

SAMPLED = ("pass", "pass^", "maj", "avg")
PLAIN = ("accuracy", "reward", "win_rate", "loglik")
_SAMPLED = re.compile(r"^(pass|pass\^|maj|avg)@(\d+)$|^(pass\^)(\d+)$")


@dataclass
class MetricSpec:
    greedy: bool = False  # accuracy
    sampled: dict[str, list[int]] = field(default_factory=dict)  # "pass"/"pass^"/"maj"/"avg" -> ks
    reward: bool = False
    win_rate: bool = False
    loglik: bool = False

    @property
    def max_k(self) -> int:
        return max((k for ks in self.sampled.values() for k in ks), default=0)

    @property
    def needs_answers(self) -> bool:
        return self.greedy or bool(self.sampled)

    @property
    def needs_greedy_text(self) -> bool:
        return self.greedy or self.reward or self.win_rate


def parse_metrics(names: list[str], key: str = "metrics") -> MetricSpec:
    """A `MetricSpec` from names like ``["accuracy", "pass@8", "maj@8", "avg@8", "pass^4"]``; an unknown name is
    a ValueError naming ``key``, the name and the known ones."""
    spec = MetricSpec()
    for name in names:
        raw = str(name).strip().lower()
        match = _SAMPLED.match(raw)
        if match:
            kind = match.group(1) or match.group(3)
            k = int(match.group(2) or match.group(4))
            if k < 1:
                raise ValueError(f"'{key}': {name!r} needs k >= 1.")
            ks = spec.sampled.setdefault(kind, [])
            if k not in ks:
                ks.append(k)
        elif raw in PLAIN:
            setattr(spec, "greedy" if raw == "accuracy" else raw, True)
        else:
            known = list(PLAIN) + ["pass@K", "pass^K", "maj@K", "avg@K"]
            close = difflib.get_close_matches(raw, known, n=1, cutoff=0.5)
            hint = f" Did you mean '{close[0]}'?" if close else ""
            raise ValueError(
                f"'{key}': unknown metric {name!r}.{hint} Known: {', '.join(known)} (K a number, e.g. pass@8)."
            )
    if not names:
        raise ValueError(f"'{key}' is empty; name at least one metric, e.g. {key}=[accuracy,pass@4].")
    return spec
