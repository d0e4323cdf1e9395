"""The console keeps a run's history (issue 47): a plain line per logged step with the key metrics, and per
evaluation with what was evaluated, for every verb (DPO, pretrain and SFT on a file printed an empty `step 25  `)."""

from __future__ import annotations

import json

from lmrl.cli import main
from lmrl.tracking import Tracker, console_line


def test_a_training_line_has_the_key_metrics_in_order():
    record = {"step": 20, "lr": 1e-3, "loss": 1.2345, "optim/grad_norm": 0.5, "memory/peak_rss_mib": 900, "time_s": 3}
    assert console_line(20, record, 200) == "step 20/200  loss=1.23  optim/grad_norm=0.5  lr=0.001"
    assert console_line(3, {"step": 3, "loss": "nan"}) == "step 3  loss=nan"  # a diverged loss shows


def test_every_verbs_evaluation_line_has_its_numbers():
    evaluations = {
        "sft on a file": {"eval/loss": 1.91},
        "sft on a task": {"eval/loss": 1.91, "eval/accuracy": 0.4},
        "dpo": {"eval/loss": 0.69, "eval/margin": 0.01, "eval/reward_accuracy": 0.55, "eval/gold_score": 0.3},
        "pretrain": {"eval/ce": 2.5, "eval/entropy": 2.4, "eval/ppl": 12.2, "time/tokens": 4096},
        "reward": {"eval/accuracy": 0.6, "eval/loss": 0.65, "eval/margin": 0.2},
    }
    for verb, metrics in evaluations.items():
        line = console_line(25, {"step": 25, **metrics, "time_s": 9.0}, 100)
        evals = [k for k in metrics if k.startswith("eval/")]
        assert line.startswith("step 25/100  eval/"), (verb, line)
        assert all(f"{k}=" in line for k in evals), (verb, line)
        assert "time" not in line, line
    line = console_line(25, {"step": 25, "eval/loss": 1.0, "eval/accuracy": 0.5, "eval/ce": 2.0})
    assert line == "step 25  eval/accuracy=0.5  eval/loss=1  eval/ce=2"  # accuracy, reward, loss first


def test_a_record_of_neither_shows_its_own_metrics():
    record = {"step": 1, "rs/reward_all": 0.3, "rs/reward_selected": 0.9, "time/sample_s": 2.0}
    assert console_line(1, record, 3) == "step 1/3  rs/reward_all=0.3  rs/reward_selected=0.9"


def test_the_tracker_prints_a_line_per_log_above_the_bar(tmp_path, capsys):
    tracker = Tracker(tmp_path, total_steps=20, description="sft")
    tracker.log(0, {"eval/loss": 2.0})
    tracker.log(10, {"loss": 1.5, "lr": 1e-3})
    tracker.log(20, {"loss": 1.25, "lr": 5e-4})
    tracker.log(20, {"eval/loss": 1.0, "eval/margin": 0.5})
    tracker.close()
    out = capsys.readouterr().out
    lines = ["step 0/20  eval/loss=2", "step 10/20  loss=1.5  lr=0.001", "step 20/20  loss=1.25  lr=0.0005"]
    lines.append("step 20/20  eval/loss=1  eval/margin=0.5")
    positions = [out.index(line) for line in lines]
    assert positions == sorted(positions), out
    assert len((tmp_path / "metrics.jsonl").read_text().splitlines()) == 4


def test_sft_on_a_file_prints_its_evaluation(tmp_path, capsys):
    """The case of the issue: SFT on a JSONL file (no task accuracy) printed `step 2  ` for its evaluations."""
    rows = [{"prompt": f"{a}+{a}=", "completion": str(2 * a)} for a in range(40)]
    (tmp_path / "train.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    (tmp_path / "eval.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows[:8]))
    argv = ["sft", f"dataset={tmp_path / 'train.jsonl'}", f"eval_dataset={tmp_path / 'eval.jsonl'}", "max_steps=2"]
    argv += ["batch_size=8", "log_every=1", "eval_every=0", "num_samples=1", f"output_dir={tmp_path / 'run'}"]
    assert main(argv) == 0
    out = capsys.readouterr().out
    assert "step 0/2  eval/loss=" in out and "step 2/2  eval/loss=" in out, out
    assert "step 1/2  loss=" in out and "step 2/2  loss=" in out, out
