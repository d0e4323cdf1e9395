"""The alarm on a broken weight sync: in fp32 the sampler's and the learner's log-probs of the same tokens agree to
rounding (~1e-5 with engine=vllm, 0 with engine=hf reusing the sampling forward), so a step whose
`policy/sampler_logp_gap` (mean |log pi_learner - log pi_sampler| over the trained tokens) exceeds `max_sampler_logp_gap`
samples some other policy: stale or half-loaded weights in the engine (measured gaps 0.7-6.6 for MoE experts left
unpacked or a tied head not re-packed after an in-place reload; shared/notes/vllm-cpu.md). The run trains on, off
policy, and nothing else shows it.

    alarm = SamplerGapAlarm.from_config(config, dtype)    # once per run
    alarm.check(metrics, step, tracker)                    # after the update's metrics are in

Loud by default (a red warning on every such step, `policy/sampler_logp_gap_alarm` = 1 in the metrics); with
`stop_on_sampler_logp_gap=true` the run stops there (`TrainingStopped`: the CLI exits 1, the last checkpoint stays).
Off in bf16, where the gap is rounding of ~4e-2 that TIS corrects, and with `async_steps` > 0, where the sampler is
older by design; every rank takes the same decision (a collective).
"""

from __future__ import annotations

import dataclasses

from lmrl.parallel import runtime
from lmrl.trainers.common import TrainingStopped


def gap_over(metrics: dict[str, float], limit: float) -> float | None:
    """This step's gap when it exceeds `limit` on some rank (that rank's gap, or the limit's own value on the
    others), else None. A collective with several processes."""
    gap = metrics.get("policy/sampler_logp_gap")
    over = gap is not None and gap > limit
    if runtime.world() > 1:
        return (gap if over else limit) if runtime.any_rank(over) else None
    return gap if over else None


@dataclasses.dataclass(frozen=True)
class SamplerGapAlarm:
    """The check of a run: ``limit`` max_sampler_logp_gap (None: off, as in bf16 and with async_steps)."""

    limit: float | None
    stop: bool = False
    engine: str = "hf"

    @classmethod
    def from_config(cls, config, dtype) -> SamplerGapAlarm:
        """From an `RLConfig` and the run's autocast dtype (not None: bf16, the check is off)."""
        on = dtype is None and not config.async_steps
        return cls(config.max_sampler_logp_gap if on else None, config.stop_on_sampler_logp_gap, config.engine)

    def check(self, metrics: dict[str, float], step: int, tracker) -> None:
        """Warn (or stop, ``stop``) when the step's sampler/learner gap exceeds ``limit``; marks the step with
        ``sampler_logp_gap_alarm`` = 1."""
        gap = gap_over(metrics, self.limit) if self.limit is not None else None
        if gap is None:
            return
        metrics["policy/sampler_logp_gap_alarm"] = 1.0
        message = (
            f"step {step}: sampler_logp_gap={gap:.3g} exceeds max_sampler_logp_gap={self.limit:g} in fp32, where a "
            f"correct sync stays near 1e-5: the engine (engine={self.engine}) does not sample the learner's weights "
            "(a broken weight sync), so this step trained off-policy. Fix: compare with engine=hf, and report the "
            "model's architecture; max_sampler_logp_gap=null turns the check off."
        )
        if self.stop:
            raise TrainingStopped(f"{message} Stopped (stop_on_sampler_logp_gap=true); the last checkpoint is intact.")
        tracker.print(f"[bold red]WARNING[/bold red] {message} (stop_on_sampler_logp_gap=true stops the run here.)")
