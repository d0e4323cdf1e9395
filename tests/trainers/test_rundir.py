"""The run directory and resume: nothing lmrl did not write is overwritten, a resume runs the config it records
(changed lr applied, unchangeable keys refused), a failed start leaves no run, absurd updates are divergence."""

import json

import pytest
import torch
import yaml
from tiny_sft import sft_main, start_failing_at_the_first_step

from lmrl.models import precision
from lmrl.models.setup import ModelSetup
from lmrl.tracking import read_jsonl
from lmrl.trainers import common, rundir
from lmrl.trainers.sft import trainer as sft


def test_a_recipe_in_output_dir_is_never_overwritten(tmp_path, capsys):
    exp = tmp_path / "exp"
    exp.mkdir()
    recipe = exp / "config.yaml"
    recipe.write_text("# my recipe, with comments\nmax_steps: 1\n")
    assert sft_main(exp, config=recipe) == 2
    assert recipe.read_text() == "# my recipe, with comments\nmax_steps: 1\n"
    assert "not written by lmrl" in capsys.readouterr().out
    assert not (exp / "metrics.jsonl").exists()


def test_resume_applies_a_changed_lr_and_records_it(tmp_path, capsys):
    run = tmp_path / "run"
    assert sft_main(run, "max_steps=2", "lr=3e-3") == 0
    assert sft_main(run, "max_steps=4", "lr=1e-5", "resume=true") == 0
    lrs = {r["step"]: r["lr"] for r in read_jsonl(run / "metrics.jsonl") if "lr" in r}
    assert lrs[2] == pytest.approx(3e-3) and lrs[3] == pytest.approx(1e-5) and lrs[4] == pytest.approx(1e-5)
    assert "lr 0.003 -> 1e-05" in capsys.readouterr().out
    assert yaml.safe_load((run / "config.yaml").read_text())["lr"] == 1e-5
    assert common.read_state(common.latest_checkpoint(run))["trainer"]["config"]["lr"] == 1e-5


def test_resume_refuses_a_changed_seed_and_keeps_config_yaml(tmp_path, capsys):
    run = tmp_path / "run"
    assert sft_main(run, "max_steps=2", "save_every=1") == 0
    (run / "checkpoints" / "step-2").rename(run / "checkpoints" / "kept-aside")  # as if killed before step 2's save
    before = {name: (run / name).read_text() for name in ("config.yaml", "metrics.jsonl", "samples.jsonl")}
    assert sft_main(run, "max_steps=4", "seed=7", "resume=true") == 2
    out = capsys.readouterr().out
    assert "seed: 0 -> 7" in out and "Traceback" not in out
    assert {name: (run / name).read_text() for name in before} == before  # a refused resume changes nothing


def test_resume_with_another_architecture_is_a_clear_error(tmp_path, capsys):
    run = tmp_path / "run"
    assert sft_main(run, "max_steps=2") == 0
    before = (run / "config.yaml").read_text()
    assert sft_main(run, "max_steps=4", "model_args.hidden_size=48", "resume=true") == 2
    out = capsys.readouterr().out
    assert "another model architecture" in out and "Traceback" not in out
    assert (run / "config.yaml").read_text() == before


def test_a_start_that_failed_before_its_first_step_leaves_no_run(tmp_path, monkeypatch):
    run = tmp_path / "run"
    assert start_failing_at_the_first_step(run, monkeypatch) == 2
    assert not rundir.has_run(run)
    assert sft_main(run, "max_steps=2") == 0  # the corrected command needs no overwrite=true
    steps = [r["step"] for r in read_jsonl(run / "metrics.jsonl")]
    assert steps.count(0) == 1 and sorted(set(steps)) == [0, 1, 2]  # the failed start's step 0 is gone


def test_precision_auto_resumes_in_the_recorded_precision(tmp_path, monkeypatch):
    run = tmp_path / "run"
    run.mkdir()
    (run / precision.RUN_FILE).write_text(json.dumps({"precision": "bf16"}))
    monkeypatch.setattr(precision, "bf16_supported", lambda device="cpu": False)  # another machine: fp32
    cfg = sft.SFTConfig(output_dir=str(run), precision="auto", resume=True)
    assert ModelSetup.from_config(cfg).dtype == torch.bfloat16
    fresh = sft.SFTConfig(output_dir=str(run), precision="auto")
    assert ModelSetup.from_config(fresh).dtype is None


def test_precision_is_recorded_in_the_run(tmp_path):
    run = tmp_path / "run"
    assert sft_main(run, "max_steps=1") == 0
    assert precision.recorded_precision(run) == "fp32"


def test_an_absurd_update_is_divergence_and_nothing_after_it_is_saved(tmp_path, capsys):
    run = tmp_path / "run"
    assert sft_main(run, "max_steps=2", "lr=1e-3") == 0
    assert sft_main(run, "max_steps=4", "lr=1e6", "save_every=1", "resume=true", "max_grad_norm=null") == 1
    assert "Training stopped" in capsys.readouterr().out
    assert common.checkpoint_step(common.latest_checkpoint(run)) == 2


def test_optimizer_step_stops_when_the_weights_blow_up():
    layer = torch.nn.Linear(4, 4)
    opt = torch.optim.AdamW(layer.parameters(), lr=1e6)
    sched = torch.optim.lr_scheduler.LambdaLR(opt, lambda s: 1.0)
    layer(torch.ones(2, 4)).sum().backward()
    with pytest.raises(common.TrainingDiverged, match="norm of the trained weights"):
        common.optimizer_step(layer, opt, sched, 1.0, 1)
    sane = torch.optim.AdamW(layer.parameters(), lr=1e-3)
    layer.weight.data.normal_(0, 0.02)
    layer.bias.data.zero_()
    layer(torch.ones(2, 4)).sum().backward()
    common.optimizer_step(layer, sane, torch.optim.lr_scheduler.LambdaLR(sane, lambda s: 1.0), 1.0, 1)


def test_a_cut_last_line_of_metrics_jsonl_is_dropped_with_a_warning_on_resume(tmp_path, capsys):
    run = tmp_path / "run"
    assert sft_main(run, "max_steps=2") == 0
    with (run / "metrics.jsonl").open("a") as f:
        f.write('{"step": 2, "loss": 1.2')  # a power loss mid-write
    assert sft_main(run, "max_steps=3", "resume=true") == 0
    assert "dropped 1 unreadable line" in capsys.readouterr().out
    assert max(r["step"] for r in read_jsonl(run / "metrics.jsonl")) == 3


# issue 33, item 3: a damaged newest checkpoint, a full disk while checkpointing


def cut(path, keep=0.5):
    path.write_bytes(path.read_bytes()[: int(path.stat().st_size * keep)])


@pytest.mark.parametrize("damaged", [common.STATE_FILE, "model.safetensors"])
def test_a_cut_newest_checkpoint_is_skipped_with_a_notice_and_the_previous_one_resumed(tmp_path, capsys, damaged):
    run = tmp_path / "run"
    assert sft_main(run, "max_steps=2", "save_every=1") == 0
    cut(run / "checkpoints" / "step-2" / damaged)
    assert sft_main(run, "max_steps=3", "save_every=1", "resume=true") == 0  # main: a traceback, no fallback
    out = " ".join(capsys.readouterr().out.split())
    assert f"checkpoint step-2 is damaged: {damaged} is cut" in out and "resuming from step-1 instead" in out
    assert (run / "checkpoints" / "damaged-step-2" / damaged).exists()  # kept aside, out of the resume order
    steps = [r["step"] for r in read_jsonl(run / "metrics.jsonl") if "loss" in r]
    assert steps == [1, 2, 3]  # step 2 trained again from step 1's checkpoint
    assert [p.name for p in common.list_checkpoints(run)] == ["step-2", "step-3"]


def test_no_whole_checkpoint_is_a_clear_error_that_changes_nothing(tmp_path, capsys):
    run = tmp_path / "run"
    assert sft_main(run, "max_steps=2", "save_every=1") == 0
    for step in (1, 2):
        cut(run / "checkpoints" / f"step-{step}" / common.STATE_FILE)
    listing = sorted(p.relative_to(run) for p in run.rglob("*"))
    assert sft_main(run, "max_steps=3", "resume=true") == 2
    out = " ".join(capsys.readouterr().out.split())
    assert "no checkpoint in" in out and "step-2: trainer_state.pt is cut" in out and "Traceback" not in out
    assert sorted(p.relative_to(run) for p in run.rglob("*")) == listing


def test_a_full_disk_while_checkpointing_is_one_paragraph_and_the_previous_checkpoint_stays(
    tmp_path, capsys, monkeypatch
):
    import errno

    run = tmp_path / "run"
    real_save = common.save_model

    def disk_full_at_step_2(model, tokenizer, path):
        real_save(model, tokenizer, path)
        if path.name == ".tmp-step-2":
            raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(common, "save_model", disk_full_at_step_2)
    assert sft_main(run, "max_steps=3", "save_every=1") == 1  # main: an 80-line traceback out of cli.main
    out = capsys.readouterr().out
    message = out[out.index("Training stopped") :]
    squashed = "".join(message.split())  # rich folds long paths
    assert "Nospaceleftondevice" in squashed and f"{run / 'checkpoints' / 'step-1'}isintact" in squashed
    assert "Traceback" not in out and len(message.strip().splitlines()) <= 8
    assert [p.name for p in (run / "checkpoints").iterdir()] == ["step-1"]  # the partial step-2 removed
