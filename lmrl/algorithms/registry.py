"""A small name -> function table, shared by every registry in `lmrl.algorithms`.

Each registry holds functions that share one signature (so callers never
special-case an entry) and each entry documents its formula and source in its
docstring. Lookups of unknown names and unknown keyword options fail with a
ValueError that lists what is supported and suggests the closest name.
"""

from __future__ import annotations

import difflib
import inspect
from collections.abc import Callable, Iterable, Iterator, Mapping
from typing import TypeVar

F = TypeVar("F", bound=Callable)


def _suggestion(name: str, choices: Iterable[str]) -> str:
    """' Did you mean 'x'?' for the closest choice, or '' when nothing is close."""
    close = difflib.get_close_matches(name, list(choices), n=1)
    return f" Did you mean '{close[0]}'?" if close else ""


class Registry:
    """Functions registered by name, looked up with helpful errors.

    >>> LOSSES = Registry("policy loss")
    >>> @LOSSES.register("ppo")
    ... def ppo(logp, old_logp, advantages, mask):
    ...     '''PPO clipped surrogate (Schulman et al. 2017).'''
    >>> LOSSES.get("ppo") is ppo
    True
    """

    def __init__(self, kind: str) -> None:
        self.kind = kind
        self._fns: dict[str, Callable] = {}
        self._traits: dict[str, dict[str, object]] = {}

    def register(self, name: str, **traits: object) -> Callable[[F], F]:
        """Decorator adding a documented function under `name` (returned unchanged). ``traits``: facts about the
        entry that callers read instead of testing its name (e.g. ``scales_by_advantage=True``)."""
        if not isinstance(name, str) or not name:
            raise ValueError(f"A {self.kind} must be registered under a non-empty string name, got {name!r}.")

        def decorator(fn: F) -> F:
            if not callable(fn):
                raise ValueError(f"Only callables can be registered as a {self.kind}; got {fn!r}.")
            if not (fn.__doc__ or "").strip():
                raise ValueError(
                    f"The {self.kind} '{name}' ({fn.__qualname__}) has no docstring. Every "
                    "registered function must document its formula and its source (book section "
                    "or paper); add a docstring before registering it."
                )
            taken = self._fns.get(name)
            if taken is not None and taken is not fn:
                raise ValueError(
                    f"The {self.kind} name '{name}' is already taken by "
                    f"{taken.__module__}.{taken.__qualname__}; registering "
                    f"{fn.__module__}.{fn.__qualname__} under it would silently replace it. "
                    "Choose another name."
                )
            self._fns[name] = fn
            self._traits[name] = dict(traits)
            return fn

        return decorator

    def get(self, name: str) -> Callable:
        """The function registered under `name`; ValueError naming the choices if none."""
        if isinstance(name, str) and name in self._fns:
            return self._fns[name]
        hint = _suggestion(name, self._fns) if isinstance(name, str) else ""
        raise ValueError(
            f"Unknown {self.kind} {name!r}.{hint} Supported names: "
            f"{', '.join(repr(n) for n in self._fns) or '(none registered)'}."
        )

    def trait(self, name: str, key: str, default: object = None) -> object:
        """The entry's declared ``key`` trait (``default`` when it declares none)."""
        self.get(name)
        return self._traits[name].get(key, default)

    def own_options(self, name: str, available: Mapping[str, object]) -> dict[str, object]:
        """The options of ``available`` that the entry declares (its keyword-only parameters): a caller hands over
        every option it has and each entry gets its own, so no caller branches on an entry's name."""
        accepted = keyword_options(self.get(name))
        return {k: v for k, v in available.items() if k in accepted}

    def names(self) -> tuple[str, ...]:
        """Registered names in registration order."""
        return tuple(self._fns)

    def __contains__(self, name: object) -> bool:
        return name in self._fns

    def __iter__(self) -> Iterator[str]:
        return iter(self._fns)

    def __len__(self) -> int:
        return len(self._fns)

    def __repr__(self) -> str:
        return f"Registry({self.kind!r}, names={list(self._fns)})"


def keyword_options(fn: Callable) -> tuple[str, ...]:
    """Names of the keyword-only parameters of `fn` (the options an entry accepts)."""
    params = inspect.signature(fn).parameters.values()
    return tuple(p.name for p in params if p.kind is inspect.Parameter.KEYWORD_ONLY)


def check_options(what: str, opts: Mapping[str, object], allowed: Iterable[str]) -> None:
    """Raise ValueError if `opts` has a key not in `allowed` (no silently ignored typos)."""
    allowed = tuple(allowed)
    unknown = [k for k in opts if k not in allowed]
    if unknown:
        key = unknown[0]
        raise ValueError(
            f"Unknown option {key!r} for {what}.{_suggestion(key, allowed)} Accepted options: "
            f"{', '.join(repr(a) for a in allowed) or '(none)'}. Remove the option or fix its "
            "spelling."
        )
