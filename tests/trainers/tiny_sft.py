"""The smallest SFT run the run-directory tests start (one layer of 32, 1-digit arithmetic, fp32, no evaluation),
through the CLI as a user starts it."""

from tests.helpers import ONE_LAYER

TINY = [
    *ONE_LAYER,
    "precision=fp32",
    "task_args.digits=1",
    "train_rows=32",
    "eval_rows=4",
    "batch_size=4",
    "eval_every=0",
    "warmup_steps=0",
    "lr_schedule=constant",
    "log_every=1",
    "check_contamination=false",
]


def sft_main(run_dir, *overrides, config=None) -> int:
    """`lmrl sft` of the tiny run into ``run_dir`` (from the recipe ``config``, if any); its exit code."""
    from lmrl import cli

    return cli.main(["sft", *(["--config", str(config)] if config else []), f"output_dir={run_dir}", *TINY, *overrides])


def start_failing_at_the_first_step(run_dir, monkeypatch) -> int:
    """The tiny run of 2 steps whose first step raises; the exit code."""
    from lmrl.trainers.sft_method import SFT

    def broken(self, step):
        raise ValueError("the first step failed")

    with monkeypatch.context() as m:
        m.setattr(SFT, "step", broken)
        return sft_main(run_dir, "max_steps=2")
