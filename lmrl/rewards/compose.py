"""Weighted composition of reward functions, with output checks and the failure policy.

    total_i = sum_k w_k * r_k(prompt_i, completion_i, columns_i)

(RLHF book Ch. 7: "an RM can be added linearly"; TRL `reward_weights`.)

Each function is called with keywords, as TRL calls `reward_funcs`:
`fn(prompts=[...], completions=[...], **columns)`, the columns being the dataset columns
(`answer`, `task`, ...) and the trainer's `truncated`, `completion_lengths`, all lists of
length N. So `def f(completions, **kwargs)`, `def f(prompts, completions, **kw)` and
`def f(completions, answer, **kw)` all work; a function that cannot take these keywords
(e.g. `def f(p, c)`, or a required column the batch lacks) is a configuration error.

Failure policy (`on_reward_error`): a reward function that raises, returns the wrong
number of values, a non-number, or NaN/inf makes `compute` raise `RewardError`,
naming the function and the first offending sample (found by re-running the function
on one sample at a time when the whole batch failed). `err.skippable` is True with
"skip" (the trainer logs `str(err)` and skips the step) and False with "stop" or for
configuration errors (a missing column), which always stop. `RewardSet.errors` counts
the failed calls and is reported as `reward/errors` in the metrics of later steps. A function
with `batch_only = True` (a reward server) is not re-run per sample to locate the failure.

Concurrency (`reward_workers`): with N > 1 the functions of a set run in a thread pool of N
threads, each once per batch (worth it for I/O-bound rewards: servers, sandboxes). An `async def`
function is awaited (in its own event loop, in its worker thread). Rows keep their order and the
failure policy is the same: every function runs, then the first failure in `rewards` order raises.

Normalisation (`reward_normalize`): each function's rewards are standardised over the batch
before weighting, z_k = (r_k - mean(r_k)) / (std(r_k) + 1e-6) (population std), so that
total = sum_k w_k * z_k and the weights alone set each function's share; the components and
their `reward/<name>/*` metrics stay unnormalised.
"""

from __future__ import annotations

import asyncio
import inspect
import math
import numbers
from collections.abc import Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from typing import TYPE_CHECKING, Any, NamedTuple

import torch

from lmrl.rewards.errors import MissingColumnError, RewardError
from lmrl.rewards.registry import RewardFn, load_reward, reward_name

if TYPE_CHECKING:
    from lmrl.config import RewardSection

ON_REWARD_ERROR = ("skip", "stop")
NORMALIZE_EPS = 1e-6


class RewardResult(NamedTuple):
    """What `RewardSet.compute` returns; unpacks as `total, components, metrics`."""

    total: torch.Tensor  # (N,) weighted sum of the components
    components: dict[str, torch.Tensor]  # name -> (N,) unweighted reward of each function
    metrics: dict[str, float]  # reward/<name>/{mean,std,<stat>}, reward/{mean,std,errors}


class _BadOutput(Exception):
    def __init__(self, cause: str, index: int | None = None) -> None:
        super().__init__(cause)
        self.cause, self.index = cause, index


class RewardSet:
    """Reward functions with weights, built from specs (registry names, 'module:function', or callables).

    Args:
        rewards: e.g. `["task", "format"]` or `["math", "mypkg.rewards:brevity", my_fn]`.
        reward_weights: one weight per reward (default all 1.0); a weight of 0 logs a
            component without training on it.
        reward_kwargs: options of registered rewards by spec name, e.g.
            `{"overlong": {"max_len": 512, "cache_len": 128}}`.
        on_reward_error: "skip" (default) or "stop", see the module docstring.
        max_skipped_steps: with "skip", this many failing calls in a row stop the run (the error turns
            non-skippable): a reward that always raises must not "train" a model on zero updates. None: never.
        reward_workers: threads that call the functions concurrently (1: one after the other).
        reward_normalize: standardise each function's rewards over the batch before weighting.

    Functions are called as `fn(prompts=..., completions=..., **columns)` (TRL's convention).
    A reward function may expose a `last_stats: dict[str, float]` attribute, refreshed on
    each call; its entries are logged as `reward/<name>/<key>` (e.g. `reward/math/errors`).
    """

    def __init__(
        self,
        rewards: Sequence[str | RewardFn],
        reward_weights: Sequence[float] | None = None,
        reward_kwargs: Mapping[str, Mapping[str, Any]] | None = None,
        on_reward_error: str = "skip",
        max_skipped_steps: int | None = 10,
        reward_workers: int = 1,
        reward_normalize: bool = False,
    ) -> None:
        if isinstance(rewards, (str, bytes)) or not isinstance(rewards, Sequence) or not rewards:
            raise ValueError(
                f"`rewards` must be a non-empty list of reward specs, got {rewards!r}. "
                "Example: rewards: [task, format] (registry names or 'module.path:function')."
            )
        if on_reward_error not in ON_REWARD_ERROR:
            raise ValueError(f"`on_reward_error` must be one of {ON_REWARD_ERROR}, got {on_reward_error!r}.")
        reward_kwargs = dict(reward_kwargs or {})
        specs = [s for s in rewards if isinstance(s, str)]
        unused = sorted(set(reward_kwargs) - set(specs) - {reward_name(s) for s in specs})
        if unused:
            raise ValueError(
                f"`reward_kwargs` has options for {unused}, which are not in `rewards` {specs}. "
                "Key `reward_kwargs` by the reward as listed in `rewards` or by its metric name (e.g. "
                "'reward_model' for 'model:PATH'), or remove the entry."
            )
        self.names = [reward_name(s) for s in rewards]
        dupes = sorted({n for n in self.names if self.names.count(n) > 1})
        if dupes:
            raise ValueError(
                f"Reward names must be unique (they key `reward/<name>/mean`), but {dupes} appear "
                "more than once in `rewards`. Remove the duplicate or rename one of the functions."
            )
        self.fns: list[RewardFn] = [
            load_reward(s, **reward_kwargs.get(s, reward_kwargs.get(reward_name(s), {})))
            if isinstance(s, str)
            else _check_callable(s)
            for s in rewards
        ]
        self.weights = _check_weights(reward_weights, self.names)
        if isinstance(reward_workers, bool) or not isinstance(reward_workers, int) or reward_workers < 1:
            raise ValueError(f"`reward_workers` must be an integer >= 1, got {reward_workers!r}.")
        self.reward_workers, self.reward_normalize = reward_workers, bool(reward_normalize)
        self.on_reward_error = on_reward_error
        self.max_skipped_steps = max_skipped_steps
        self.errors = 0  # number of compute() calls that raised RewardError
        self.consecutive_errors = 0  # ... in a row, up to the last compute() call

    @classmethod
    def from_config(cls, config: RewardSection) -> RewardSet:
        """The set a config's rewards section describes (`lmrl.config.RewardSection`)."""
        return cls(
            config.rewards,
            config.reward_weights or None,
            config.reward_kwargs,
            config.on_reward_error,
            config.max_skipped_steps,
            reward_workers=config.reward_workers,
            reward_normalize=config.reward_normalize,
        )

    def compute(self, prompts: Sequence[str], completions: Sequence[str], **columns: Any) -> RewardResult:
        """Score a batch: each function once on the whole batch, then the weighted total and metrics."""
        _check_batch(prompts, completions, columns)
        components: dict[str, torch.Tensor] = {}
        metrics: dict[str, float] = {}
        for name, outcome in zip(self.names, self._call_all(prompts, completions, columns)):
            if isinstance(outcome, RewardError):
                self.errors += 1
                self.consecutive_errors += 1
                if outcome.skippable and self.max_skipped_steps and self.consecutive_errors >= self.max_skipped_steps:
                    outcome.stop_after(self.consecutive_errors)
                raise outcome
            components[name] = torch.tensor(outcome, dtype=torch.float32)  # (N,)
            metrics[f"reward/{name}/mean"] = components[name].mean().item()
            metrics[f"reward/{name}/std"] = components[name].std(correction=0).item()
            stats = getattr(self.fns[self.names.index(name)], "last_stats", None)
            if isinstance(stats, Mapping):
                metrics.update({f"reward/{name}/{key}": float(v) for key, v in stats.items()})
        weights = torch.tensor(self.weights, dtype=torch.float32)  # (K,)
        stacked = torch.stack([components[name] for name in self.names])  # (K, N)
        if self.reward_normalize:
            mean, std = stacked.mean(dim=1, keepdim=True), stacked.std(dim=1, correction=0, keepdim=True)  # (K, 1)
            stacked = (stacked - mean) / (std + NORMALIZE_EPS)  # (K, N)
        total = (weights[:, None] * stacked).sum(dim=0)  # (N,)
        metrics["reward/mean"] = total.mean().item()
        metrics["reward/std"] = total.std(correction=0).item()
        metrics["reward/errors"] = float(self.errors)
        self.consecutive_errors = 0
        return RewardResult(total, components, metrics)

    def _call_all(
        self, prompts: Sequence[str], completions: Sequence[str], columns: dict[str, Any]
    ) -> list[list[float] | RewardError]:
        """Each function's checked values or its RewardError, in `rewards` order; serial with one worker."""

        def call(name: str, fn: RewardFn) -> list[float] | RewardError:
            try:
                return self._call_checked(name, fn, prompts, completions, columns)
            except RewardError as err:
                return err

        if self.reward_workers == 1 or len(self.fns) == 1:
            out: list[list[float] | RewardError] = []
            for name, fn in zip(self.names, self.fns):
                out.append(call(name, fn))
                if isinstance(out[-1], RewardError):
                    break  # as before: the functions after a failure are not called
            return out
        with ThreadPoolExecutor(max_workers=min(self.reward_workers, len(self.fns))) as pool:
            return list(pool.map(call, self.names, self.fns))

    def _call_checked(
        self,
        name: str,
        fn: RewardFn,
        prompts: Sequence[str],
        completions: Sequence[str],
        columns: dict[str, Any],
    ) -> list[float]:
        n = len(completions)

        def fail(cause: str, index: int | None, config_error: bool = False, fix: str = "") -> RewardError:
            return RewardError(
                name,
                cause,
                sample_index=index,
                num_samples=n,
                prompt=None if index is None else str(prompts[index]),
                completion=None if index is None else str(completions[index]),
                skippable=self.on_reward_error == "skip",
                config_error=config_error,
                fix=fix,
            )

        unbound = _bind_error(fn, columns)
        if unbound:
            raise fail(
                f"it cannot be called as {name}(prompts=..., completions=..., **columns): {unbound}",
                None,
                config_error=True,
                fix="it is called with keywords (TRL's convention): name its parameters prompts, "
                f"completions or a column ({', '.join(sorted(columns)) or 'none here'}) and end with **kwargs.",
            )
        try:
            return _as_floats(_invoke(fn, prompts=list(prompts), completions=list(completions), **columns), n)
        except MissingColumnError as err:
            raise fail(f"a required column is missing. {err}", None, config_error=True) from err
        except _BadOutput as err:
            if err.index is not None:
                raise fail(err.cause, err.index, fix=_OUTPUT_FIX) from None
            batch_cause, batch_err, fix = err.cause, None, _OUTPUT_FIX
        except SystemExit as err:  # sys.exit() in a reward would end the run with its exit code and no message
            raise fail(
                f"it called sys.exit({err.code!r}), which would end the training run",
                None,
                config_error=True,
                fix="return a reward (e.g. 0.0) instead of exiting.",
            ) from None
        except Exception as err:
            batch_cause, batch_err, fix = f"it raised {type(err).__name__}: {err}", err, ""
        if getattr(fn, "batch_only", False):
            raise fail(batch_cause, None, fix=fix) from batch_err
        index, cause = _find_bad_sample(fn, prompts, completions, columns)
        if index is not None and cause != batch_cause:
            batch_cause = f"{batch_cause}; run on this sample alone, {cause}"
        raise fail(batch_cause, index, fix=fix) from batch_err


_OUTPUT_FIX = "return one finite float per completion, as a list or 1-D tensor of len(completions)."


def _invoke(fn: RewardFn, **kwargs: Any) -> Any:
    """`fn(**kwargs)`, awaited in a fresh event loop if it is an `async def` function."""
    out = fn(**kwargs)
    if inspect.isawaitable(out):

        async def wait() -> Any:
            return await out

        try:
            asyncio.get_running_loop()
        except RuntimeError:  # no loop in this thread: the usual case
            return asyncio.run(wait())
        with ThreadPoolExecutor(max_workers=1) as pool:  # called from async code: a loop of its own elsewhere
            return pool.submit(asyncio.run, wait()).result()
    return out


def _bind_error(fn: RewardFn, columns: dict[str, Any]) -> str:
    """Why `fn(prompts=, completions=, **columns)` cannot bind ("" if it can or the signature is unknown)."""
    try:
        inspect.signature(fn).bind(prompts=[], completions=[], **columns)
    except TypeError as err:
        return str(err)
    except ValueError:  # no signature (some builtins)
        pass
    return ""


def _find_bad_sample(
    fn: RewardFn, prompts: Sequence[str], completions: Sequence[str], columns: dict[str, Any]
) -> tuple[int | None, str]:
    """Re-run `fn` on one sample at a time; the first that fails on its own, with its cause."""
    for i in range(len(completions)):
        one = {k: v[i : i + 1] for k, v in columns.items()}
        try:
            _as_floats(_invoke(fn, prompts=[prompts[i]], completions=[completions[i]], **one), 1)
        except _BadOutput as err:
            return i, err.cause
        except Exception as err:  # noqa: BLE001 - any failure locates the sample
            return i, f"it raised {type(err).__name__}: {err}"
    return None, ""


def _as_floats(out: Any, n: int) -> list[float]:
    """Check a reward function's output: n finite real numbers (list, tuple, 1-D tensor/array)."""
    if hasattr(out, "tolist") and hasattr(out, "ndim"):  # torch.Tensor, numpy.ndarray
        if out.ndim != 1:
            raise _BadOutput(f"it returned an array of shape {tuple(out.shape)}, expected ({n},)")
        out = out.tolist()
    if isinstance(out, (str, bytes)) or not isinstance(out, Sequence):
        raise _BadOutput(f"it returned a {type(out).__name__}, not a list of {n} floats")
    if len(out) != n:
        raise _BadOutput(f"it returned {len(out)} values for {n} completions")
    values = []
    for i, v in enumerate(out):
        if not isinstance(v, numbers.Real):
            raise _BadOutput(f"it returned {v!r} ({type(v).__name__}), not a number", i)
        if not math.isfinite(float(v)):
            bad = sum(1 for x in out if isinstance(x, numbers.Real) and not math.isfinite(float(x)))
            raise _BadOutput(f"it returned {float(v)} ({bad} of {n} values are NaN or inf)", i)
        values.append(float(v))
    return values


def _check_batch(prompts: Sequence[str], completions: Sequence[str], columns: dict[str, Any]) -> None:
    n = len(completions)
    if n == 0 or len(prompts) != n:
        raise ValueError(
            f"RewardSet.compute needs one prompt per completion and at least one completion, got "
            f"{len(prompts)} prompts and {n} completions. Repeat each prompt once per sample (prompt-major)."
        )
    for key, value in columns.items():
        if isinstance(value, (str, bytes, Mapping)) or not hasattr(value, "__len__") or len(value) != n:
            size = len(value) if hasattr(value, "__len__") else type(value).__name__
            raise ValueError(
                f"RewardSet.compute: column '{key}' must hold one value per completion ({n}), got {size}. "
                "Pass every dataset column as a list aligned with `completions`."
            )


def _check_callable(fn: Any) -> RewardFn:
    if not callable(fn):
        raise ValueError(f"A reward must be a spec string or a callable, got {type(fn).__name__} {fn!r}.")
    return fn


def _check_weights(weights: Sequence[float] | None, names: list[str]) -> list[float]:
    if weights is None:
        return [1.0] * len(names)
    if isinstance(weights, (str, bytes)) or not isinstance(weights, Sequence) or len(weights) != len(names):
        raise ValueError(
            f"`reward_weights` must list one number per reward {names}, got {weights!r}. "
            "Example: rewards: [task, format] with reward_weights: [1.0, 0.2]."
        )
    for name, w in zip(names, weights):
        if isinstance(w, bool) or not isinstance(w, numbers.Real) or not math.isfinite(float(w)):
            raise ValueError(f"`reward_weights`: the weight of '{name}' must be a finite number, got {w!r}.")
    return [float(w) for w in weights]
