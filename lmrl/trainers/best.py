"""``keep_best=<metric>``: the model at the best evaluation so far, in ``output_dir/best`` (HF format, like final/).

Besides the newest ``keep_checkpoints`` (for resuming), a run keeps the weights that scored best on one evaluation
metric (OpenRLHF ``--ckpt.best_metric_key``, NeMo-RL ``keep_top_k`` + ``metric_name``). ``best/best.json`` records
the metric, its value and the step; a resumed run reads it, so a later evaluation must beat the recorded value.
Every evaluation is offered, the initial one (step 0, the starting model) included; ties keep the earlier step.
"""

from __future__ import annotations

import json
import math
import shutil
from pathlib import Path

from lmrl.parallel import runtime
from lmrl.report.metric_names import configured_metric, current_name
from lmrl.trainers import common, dist_checkpoint

RECORD = "best.json"


def lower_is_better(metric: str, mode: str = "auto") -> bool:
    """mode "min"/"max" decide; "auto": lower for a loss or a cross-entropy (a name that starts with ``loss`` or whose
    last part does, or whose last part is ``ce`` or ends with ``_ce``: loss/policy, eval/loss, eval/ptx_ce, eval/ce),
    higher for everything else."""
    if mode != "auto":
        return mode == "min"
    leaf = metric.rsplit("/", 1)[-1]
    return metric.startswith("loss") or leaf.startswith("loss") or leaf == "ce" or leaf.endswith("_ce")


def is_better(value: float, best: float | None, lower: bool) -> bool:
    """Strictly better than ``best`` (None: nothing recorded yet); NaN never is."""
    if math.isnan(value):
        return False
    return best is None or (value < best if lower else value > best)


class BestKeeper:
    """Offers each evaluation's metrics; saves ``best/`` when ``metric`` improved."""

    def __init__(self, run_dir: Path, metric: str, mode: str = "auto"):
        metric = configured_metric(metric, "keep_best")  # an old name (keep_best=val/ce) still works
        self.dir, self.metric, self.lower = Path(run_dir) / "best", metric, lower_is_better(metric, mode)
        record = self.dir / RECORD
        saved = json.loads(record.read_text()) if record.exists() else {}
        same = current_name(str(saved.get("metric"))) == metric  # best.json of an older run: its old name
        self.value: float | None = saved.get("value") if same else None
        self.step: int | None = saved.get("step") if self.value is not None else None

    def offer(self, run: common.Run, step: int, metrics: dict[str, float], model, tokenizer) -> bool:
        """Save the model as ``best/`` if ``metrics[metric]`` beats the best so far; True when it did. A metric the
        evaluation does not report fails with the names it does report (at the first evaluation, before training)."""
        if self.metric not in metrics:
            raise ValueError(
                f"keep_best={self.metric!r}: the evaluation reports no such metric; it reports "
                f"{sorted(metrics)}. Fix: keep_best=<one of those> (eval_every > 0 evaluates during the "
                "run), or keep_best=null."
            )
        value = float(metrics[self.metric])
        if not is_better(value, self.value, self.lower):
            return False
        tmp = ".tmp-best"
        if runtime.world() > 1:  # every rank: FSDP gathers the full weights
            dist_checkpoint.save_final(run, model, tokenizer, name=tmp)
        elif runtime.is_main():
            common.save_final(run, model, tokenizer, name=tmp)
        if runtime.is_main():
            (run.dir / tmp / RECORD).write_text(json.dumps({"metric": self.metric, "value": value, "step": step}))
            shutil.rmtree(self.dir, ignore_errors=True)
            (run.dir / tmp).rename(self.dir)
        runtime.barrier()
        self.value, self.step = value, step
        return True
