"""Errors raised by reward functions and by `RewardSet.compute`.

`RewardError` is what a trainer catches around `RewardSet.compute`:

    try:
        result = reward_set.compute(prompts, completions, **columns)
    except RewardError as err:
        if not err.skippable:
            raise                    # on_reward_error="stop", or a config error
        log(str(err))                # one readable paragraph
        continue                     # skip the step; reward_set.errors counts it
"""

from __future__ import annotations

SNIPPET_CHARS = 200


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
        reward: name of the reward function (as in `rewards/<name>/mean`).
        sample_index: index of the first offending sample in the batch, or None if
            the failure could not be tied to one sample.
        prompt, completion: that sample's text (full; the message truncates them).
        cause: what went wrong, e.g. "raised ZeroDivisionError: division by zero".
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
    ) -> None:
        self.reward = reward
        self.cause = cause
        self.sample_index = sample_index
        self.num_samples = num_samples
        self.prompt = prompt
        self.completion = completion
        self.skippable = skippable and not config_error
        self.config_error = config_error
        super().__init__(self._message())

    def _message(self) -> str:
        if self.sample_index is None:
            unlocated = "" if self.config_error else " (no single sample reproduces it)"
            where = f"on a batch of {self.num_samples} samples{unlocated}"
            sample = ""
        else:
            where = f"on sample {self.sample_index} of {self.num_samples}"
            sample = f" Prompt: {snippet(self.prompt)}. Completion: {snippet(self.completion)}."
        if self.config_error:
            action = "This is a configuration error, so the run stops whatever on_reward_error says."
        elif self.skippable:
            action = "The step is skipped (on_reward_error='skip'); set on_reward_error='stop' to stop instead."
        else:
            action = (
                "The run stops (on_reward_error='stop'); fix the reward function or its inputs, "
                "or set on_reward_error='skip' to skip such steps."
            )
        cause = self.cause.rstrip(". ")
        return f"Reward function '{self.reward}' failed {where}: {cause}.{sample} {action}"
