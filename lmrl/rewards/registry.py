"""The reward registry: built-in verifiers by name, and user functions by import path.

A reward function is a plain callable (TRL-style)

    fn(prompts: list[str], completions: list[str], **columns) -> list[float]

where `columns` are the dataset columns of each sample as lists of length N
(e.g. `answer`, `task`, `meta`) plus the trainer's `truncated: list[bool]` and
`completion_lengths: list[int]` (tokens). Functions accept and ignore unknown
keyword arguments.

`REWARDS` maps a name to a *factory*: `REWARDS[name](**kwargs) -> reward fn`, so
every entry has one signature and configurable rewards take their options there.
"""

from __future__ import annotations

import importlib
import inspect
import re
from collections.abc import Callable
from typing import Any

from lmrl.rewards.remote import is_url, url_name
from lmrl.rewards.types import RewardFactory, RewardFn

REWARDS: dict[str, RewardFactory] = {}

MODEL_PREFIX = "model:"
_IMPORT_SPEC = re.compile(r"^([A-Za-z_]\w*(?:\.[A-Za-z_]\w*)*):([A-Za-z_]\w*(?:\.[A-Za-z_]\w*)*)$")


def register_reward(name: str) -> Callable[[RewardFactory], RewardFactory]:
    """Decorator: register a reward factory under `name` (a different factory under a taken name raises)."""

    def decorator(factory: RewardFactory) -> RewardFactory:
        if name in REWARDS and REWARDS[name] is not factory:
            raise ValueError(
                f"Reward name '{name}' is already registered to {REWARDS[name].__module__}."
                f"{REWARDS[name].__qualname__}; pick another name for {factory.__qualname__}."
            )
        REWARDS[name] = factory
        return factory

    return decorator


def make_reward(name: str, **kwargs: Any) -> RewardFn:
    """Build the registered reward `name` with its options.

    Example: `make_reward("overlong", max_len=512, cache_len=128)`.
    """
    if name not in REWARDS:
        raise ValueError(
            f"Unknown reward '{name}'. Registered rewards are {sorted(REWARDS)}; "
            "a user function is given as 'module.path:function'."
        )
    factory = REWARDS[name]
    _check_options(name, factory, kwargs)
    return factory(**kwargs)


def _check_options(name: str, factory: RewardFactory, kwargs: dict[str, Any], skip: int = 0) -> None:
    """Raise a ValueError naming the options when `factory` cannot take `kwargs` (after `skip` positionals)."""
    try:
        inspect.signature(factory).bind(*[None] * skip, **kwargs)
    except TypeError as err:
        raise ValueError(
            f"Bad options for reward '{name}': {err}. Its options are "
            f"{_describe_options(factory, skip)}; set them in `reward_kwargs.{reward_name(name)}`."
        ) from None


def load_reward(spec: str, **kwargs: Any) -> RewardFn:
    """Resolve a reward spec: a registry name (options in `kwargs`), 'model:PATH' (a reward model
    trained with `lmrl reward`; options of `reward_model_reward`), 'http(s)://host:port/path' (a reward
    server; options of `lmrl.rewards.remote.http_reward`) or 'module.path:function'."""
    if not isinstance(spec, str):
        raise ValueError(f"A reward spec must be a string, got {type(spec).__name__} {spec!r}.")
    if spec in REWARDS:
        return make_reward(spec, **kwargs)
    if is_url(spec):
        from lmrl.rewards.remote import http_reward

        _check_options(spec, http_reward, kwargs, skip=1)
        return http_reward(spec, **kwargs)
    if spec.startswith(MODEL_PREFIX):
        from lmrl.rewards.reward_model import reward_model_reward  # loads torch models: import on use

        return reward_model_reward(spec[len(MODEL_PREFIX) :], **kwargs)
    match = _IMPORT_SPEC.match(spec)
    if match is None:
        raise ValueError(
            f"Unknown reward spec '{spec}'. Accepted are a registered name {sorted(REWARDS)} "
            "a reward server as 'http://host:port/path', or a user function as 'module.path:function' (the module must be importable, "
            "e.g. on PYTHONPATH or in the working directory)."
        )
    if kwargs:
        raise ValueError(
            f"Reward '{spec}' is a user function and takes no options, got {sorted(kwargs)}. "
            "Bind options in your own code (e.g. functools.partial in the module) instead."
        )
    return _import_function(spec, match.group(1), match.group(2))


def reward_name(spec: str | RewardFn) -> str:
    """The name used in metrics (`reward/<name>/mean`): the registry name, the function name of
    'module:function', a URL's last path segment, or a callable's `__name__`."""
    if isinstance(spec, str) and spec.startswith(MODEL_PREFIX):
        return "reward_model"
    if is_url(spec):
        return url_name(spec)
    if isinstance(spec, str):
        return spec.rsplit(":", 1)[-1].rsplit(".", 1)[-1]
    return getattr(spec, "__name__", type(spec).__name__)


def _import_function(spec: str, module_name: str, attr_path: str) -> RewardFn:
    try:
        module = importlib.import_module(module_name)
    except ModuleNotFoundError as err:
        if err.name == module_name or module_name.startswith(f"{err.name}."):  # the module itself
            raise ValueError(
                f"Cannot load reward '{spec}': no module named '{module_name}' (function "
                f"'{attr_path}'). Put the module's folder on PYTHONPATH or run from its folder, "
                "and check the spelling of 'module.path:function'."
            ) from err
        raise ValueError(
            f"Cannot load reward '{spec}': importing module '{module_name}' failed because it "
            f"imports a missing module: {err}. Install that dependency or fix the import."
        ) from err
    except Exception as err:
        raise ValueError(
            f"Cannot load reward '{spec}': importing module '{module_name}' raised "
            f"{type(err).__name__}: {err}. Fix the module so it imports cleanly."
        ) from err
    obj: Any = module
    for part in attr_path.split("."):
        if not hasattr(obj, part):
            public = sorted(n for n in dir(module) if not n.startswith("_") and callable(getattr(module, n)))
            raise ValueError(
                f"Cannot load reward '{spec}': module '{module_name}' ({module.__file__}) has no "
                f"attribute '{attr_path}'. Its public callables are {public}; fix the function "
                "name after the colon."
            )
        obj = getattr(obj, part)
    if not callable(obj):
        raise ValueError(
            f"Cannot load reward '{spec}': '{module_name}:{attr_path}' is not callable (it is of type "
            f"{type(obj).__name__}). Point the spec at a callable fn(prompts, completions, **columns)."
        )
    return obj


def _describe_options(factory: RewardFactory, skip: int = 0) -> str:
    params = list(inspect.signature(factory).parameters.values())[skip:]
    opts = [p.name if p.default is inspect.Parameter.empty else f"{p.name}={p.default!r}" for p in params]
    return "(" + ", ".join(opts) + ")" if opts else "none"
