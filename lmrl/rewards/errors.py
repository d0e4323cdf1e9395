"""Errors raised by reward functions and by `RewardSet.compute`, and the trainers' skip of a failed step.

`RewardError` is what a trainer catches around `RewardSet.compute`, through `RewardFailure`:

    with RewardFailure() as failure:
        result = reward_set.compute(prompts, completions, **columns)   # a non-skippable error propagates
    if failure.skips(tracker, step):     # any rank's failure: every rank skips (the same forwards on every rank)
        return failure.skipped(reward_set.errors)   # {"reward/errors": ..., "reward/skipped": 1.0}
"""

from __future__ import annotations

from lmrl.parallel import runtime

SNIPPET_CHARS = 100
CAUSE_CHARS = 400


def snippet(text: object, limit: int = SNIPPET_CHARS) -> str:
    """`repr` of `text` cut to about `limit` characters, for error messages."""
    text = str(text)
    if len(text) > limit:
        text = text[:limit] + f"... [{len(text) - limit} more chars]"
    return repr(text)


class MissingColumnError(ValueError):
    """A reward function needs a dataset column (or trainer column) that the batch lacks.

    This is a configuration error, never a property of one sample: `RewardSet`
    turns it into a non-skippable `RewardError` so the run stops at once instead
    of skipping every step.
    """

    def __init__(self, reward: str, column: str, present: list[str], hint: str = "") -> None:
        self.reward, self.column = reward, column
        hint = f" {hint}" if hint else ""
        has = f"only the columns {sorted(present)}" if present else "no columns"
        super().__init__(
            f"Reward '{reward}' needs the column '{column}'.{hint} The batch has {has}. Add "
            f"'{column}' to the dataset (or map an existing column to it), or remove '{reward}' "
            "from `rewards`."
        )


class RewardError(ValueError):
    """A reward function raised, returned the wrong length, a non-number, or NaN/inf.

    Attributes:
        reward: name of the reward function (as in `reward/<name>/mean`).
        sample_index: index of the first offending sample in the batch, or None if
            the failure could not be tied to one sample.
        prompt, completion: that sample's text (full; the message truncates them).
        cause: what went wrong, e.g. "raised ZeroDivisionError: division by zero".
        fix: how to fix it, e.g. "return one float per completion" ("" if unknown).
        skippable: True if the trainer should log the message, count the error and
            skip the step (`on_reward_error="skip"`); False if the run must stop
            (`on_reward_error="stop"`, or a configuration error).
        config_error: True for errors no retry can fix (a missing column); never skippable.
    """

    def __init__(
        self,
        reward: str,
        cause: str,
        *,
        sample_index: int | None,
        num_samples: int,
        prompt: str | None = None,
        completion: str | None = None,
        skippable: bool,
        config_error: bool = False,
        fix: str = "",
    ) -> None:
        self.reward = reward
        self.cause = cause
        self.fix = fix
        self.sample_index = sample_index
        self.num_samples = num_samples
        self.prompt = prompt
        self.completion = completion
        self.skippable = skippable and not config_error
        self.config_error = config_error
        self.repeats = 0  # set by `stop_after`
        super().__init__(self._message())

    def stop_after(self, repeats: int) -> None:
        """Make this error stop the run: the reward failed ``repeats`` steps in a row under on_reward_error=skip."""
        self.skippable, self.repeats = False, repeats
        self.args = (self._message(),)

    def _message(self) -> str:
        """What and where on line 1, the sample (cut to SNIPPET_CHARS) and the fix below: at most 5 lines."""
        if self.sample_index is None:
            unlocated = "" if self.config_error else " (no single sample reproduces it)"
            where = f"on a batch of {self.num_samples} samples{unlocated}"
        else:
            where = f"on sample {self.sample_index} of {self.num_samples}"
        cause = " ".join(self.cause.split()).rstrip(". ")  # one line, however many the exception had
        if len(cause) > CAUSE_CHARS:
            cause = cause[:CAUSE_CHARS] + f"... [{len(cause) - CAUSE_CHARS} more chars]"
        lines = [f"Reward function '{self.reward}' failed {where}: {cause}."]
        if self.sample_index is not None:
            lines += [f"  prompt: {snippet(self.prompt)}", f"  completion: {snippet(self.completion)}"]
        if self.fix:
            lines.append(f"Fix: {self.fix}")
        if self.config_error:
            lines.append("This is a configuration error, so the run stops whatever on_reward_error says.")
        elif self.repeats:
            lines.append(
                f"It failed {self.repeats} steps in a row (max_skipped_steps={self.repeats}), so the run "
                f"stops: fix the reward function, or raise max_skipped_steps."
            )
        elif self.skippable:
            lines.append("The step is skipped (on_reward_error='skip'); on_reward_error='stop' stops instead.")
        else:
            lines.append("The run stops (on_reward_error='stop'); on_reward_error='skip' skips such steps instead.")
        return "\n".join(lines)


SKIPPED = "reward/skipped"
"""Logged as 1 by a step a failing reward function skipped: a run whose every step was skipped trained nothing, and
`lmrl.trainers.loop` stops it (exit 1) instead of saving its model as final/."""


class RewardFailure:
    """A context that keeps a skippable `RewardError` (on_reward_error="skip": the error message is at most ~8
    short lines) instead of raising it; ``skips`` then tells whether the step is skipped on every rank."""

    def __init__(self) -> None:
        self.error: RewardError | None = None

    def __enter__(self) -> RewardFailure:
        return self

    def __exit__(self, kind, error, traceback) -> bool:
        if isinstance(error, RewardError) and error.skippable:
            self.error = error
            return True
        return False

    @staticmethod
    def skipped(errors: int) -> dict[str, float]:
        """The metrics of a skipped step: the failures so far and the `SKIPPED` marker."""
        return {"reward/errors": float(errors), SKIPPED: 1.0}

    def skips(self, tracker, step: int) -> bool:
        """True (after printing why) when a reward failed on this or on another process."""
        if not runtime.any_rank(self.error is not None):
            return False
        tracker.print(f"[yellow]step {step} skipped: {self.error or 'a reward function failed on another process'}")
        return True
