"""SFT: it learns, every parameter moves, accumulation is exact, resume is exact, bad input is caught early."""

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch

from lmrl.config import ConfigError, load_config
from lmrl.data.loading import load_rows
from lmrl.data.sft import build_sft_examples
from lmrl.data.tokenizers import build_char_tokenizer
from lmrl.models import load_model
from lmrl.tracking import read_jsonl
from lmrl.trainers import common, sft_method, sft_step
from lmrl.trainers.sft import trainer as sft
from tests.helpers import TINY


def config(tmp_path, *overrides):
    return load_config(sft.SFTConfig, None, [f"output_dir={tmp_path / 'run'}", "precision=fp32", *TINY, *overrides])


def tiny_examples(n=8):
    tokenizer = build_char_tokenizer()
    rows = load_rows("task:arithmetic", split="train", limit=n, digits=1)
    examples, _ = build_sft_examples(rows, tokenizer, max_length=64)
    return tokenizer, examples


def tiny_model(tokenizer):
    args = {t.split("=")[0].split(".")[1]: int(t.split("=")[1]) for t in TINY}
    return load_model("builtin:tiny", tokenizer, seed=0, model_args=args)


def grads(model):
    return {n: p.grad.detach().clone() for n, p in model.named_parameters() if p.grad is not None}


def padded_step(model, examples, pad_id, grad_accum):
    return sft_step.train_step(
        model, sft_step.padded_micro_batches(examples, pad_id, grad_accum), None, 1, sft_step.labelled_tokens(examples)
    )


def test_every_parameter_changes_after_one_step(tmp_path):
    tokenizer, examples = tiny_examples()
    model = tiny_model(tokenizer)
    cfg = config(tmp_path, "lr=1e-2", "warmup_steps=0")
    optimizer, before = common.build_optimizer(model, cfg), {n: p.detach().clone() for n, p in model.named_parameters()}
    scheduler = common.build_scheduler(optimizer, cfg)
    padded_step(model, examples, tokenizer.pad_token_id, 1)
    common.optimizer_step(model, optimizer, scheduler, 1.0, step=1)
    unchanged = [n for n, p in model.named_parameters() if torch.equal(p, before[n])]
    assert not unchanged, f"parameters not updated: {unchanged}"


def test_gradient_accumulation_4x2_equals_batch_8():
    tokenizer, examples = tiny_examples(8)
    # unequal lengths make a per-micro-batch mean differ from the batch token mean: the test can fail
    assert len({len(e.input_ids) for e in examples}) > 1
    model = tiny_model(tokenizer)
    full = padded_step(model, examples, tokenizer.pad_token_id, 1)
    g_full = grads(model)
    model.zero_grad(set_to_none=True)
    accum = padded_step(model, examples, tokenizer.pad_token_id, 4)
    g_accum = grads(model)
    assert accum["loss"] == pytest.approx(full["loss"], rel=1e-5)
    for name in g_full:
        torch.testing.assert_close(g_accum[name], g_full[name], rtol=1e-4, atol=1e-6)


def test_packed_micro_batches_give_the_padded_loss_and_gradients():
    tokenizer, examples = tiny_examples(8)
    model = tiny_model(tokenizer)
    padded = padded_step(model, examples, tokenizer.pad_token_id, 1)
    g_padded = grads(model)
    model.zero_grad(set_to_none=True)
    longest = max(len(e.input_ids) for e in examples)
    micro = sft_step.packed_micro_batches(examples, max_tokens=2 * longest)
    assert 1 < len(micro) < len(examples)  # several rows per sequence, several sequences
    packed = sft_step.train_step(model, micro, None, 1, sft_step.labelled_tokens(examples))
    assert packed["loss"] == pytest.approx(padded["loss"], abs=1e-5)
    for name, grad in grads(model).items():
        torch.testing.assert_close(grad, g_padded[name], rtol=1e-4, atol=1e-5)


def test_packing_is_refused_with_grad_accum_or_a_too_small_budget(tmp_path):
    with pytest.raises(ConfigError, match="replaces grad_accum"):
        config(tmp_path, "max_tokens_per_microbatch=512", "grad_accum=2")
    with pytest.raises(ConfigError, match="max_length"):
        config(tmp_path, "max_tokens_per_microbatch=100", "max_length=256")


def test_sft_learns_arithmetic(tmp_path):
    cfg = config(
        tmp_path,
        "model=builtin:tiny",
        "model_args={}",
        "task_args.digits=1",
        "train_rows=500",
        "eval_rows=100",
        "max_steps=150",
        "batch_size=32",
        "lr=1e-3",
        "eval_every=0",
        "save_every=0",
        "log_every=50",
    )
    result = sft.train(cfg)
    # 1-digit +/-: ~20 held-out problems never seen in training (an accuracy step is 0.05). Measured on a 2-core Xeon:
    # eval CE 4.73 -> 0.775 with 1 or 2 threads, accuracy 0.0 -> 0.15 (1 thread) / 0.10 (2). At lr=3e-3 the same run
    # ended at 0.835 / 0.971 and 0.15 / 0.05: the accuracy of so few problems moves with the float summation order of
    # the thread count, the held-out loss much less; so the loss carries the claim and accuracy must rise.
    assert result["initial/eval/accuracy"] < 0.1
    assert result["eval/loss"] < 0.25 * result["initial/eval/loss"], result
    assert result["eval/accuracy"] > result["initial/eval/accuracy"], result
    run = Path(cfg.output_dir)
    for name in ("config.yaml", "metrics.jsonl", "samples.jsonl", "final/config.json", "plots/loss.png"):
        assert (run / name).exists(), name
    assert (run / "checkpoints" / "step-150" / common.STATE_FILE).exists()
    losses = [r["loss"] for r in read_jsonl(run / "metrics.jsonl") if "loss" in r]
    assert losses[-1] < losses[0]


def _sft_cmd(out, *extra):
    return [
        sys.executable,
        "-m",
        "lmrl",
        "sft",
        f"output_dir={out}",
        "precision=fp32",
        *TINY,
        "task_args.digits=1",
        "train_rows=200",
        "eval_rows=20",
        "max_steps=40",
        "batch_size=16",
        "eval_every=0",
        "save_every=4",
        "log_every=1",
        "keep_checkpoints=20",
        *extra,
    ]


@pytest.mark.slow  # ~30-50 s: a killed CLI run and its resume; tests/parallel/test_kill_resume.py kills a rank by default
def test_resume_after_kill_matches_uninterrupted_run(tmp_path):
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    full_dir, killed_dir = tmp_path / "full", tmp_path / "killed"
    subprocess.run(_sft_cmd(full_dir), check=True, env=env, capture_output=True)

    proc = subprocess.Popen(_sft_cmd(killed_dir), env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    deadline = time.time() + 120
    while time.time() < deadline and not (killed_dir / "checkpoints" / "step-8" / common.STATE_FILE).exists():
        time.sleep(0.05)
    proc.send_signal(signal.SIGKILL)
    proc.wait()
    last = common.latest_checkpoint(killed_dir)
    assert last is not None and common.checkpoint_step(last) < 40, "the run was not killed mid-way"
    subprocess.run(_sft_cmd(killed_dir, "resume=true"), check=True, env=env, capture_output=True)

    full = read_jsonl(full_dir / "metrics.jsonl")
    resumed = read_jsonl(killed_dir / "metrics.jsonl")
    assert [r["step"] for r in resumed] == [r["step"] for r in full]
    for a, b in zip(full, resumed):
        for key in ("loss", "optim/grad_norm", "eval/accuracy", "eval/loss"):
            if key in a:
                assert b[key] == pytest.approx(a[key], rel=1e-5, abs=1e-7), (a["step"], key)


def _run_cli(*args):
    return subprocess.run([sys.executable, "-m", "lmrl", *args], capture_output=True, text=True, timeout=300)


def _write(path, lines):
    path.write_text("".join(line + "\n" for line in lines))
    return path


@pytest.mark.parametrize(
    "make_data, overrides, message",
    [  # each case is a CLI process (~8-13 s): one in the default suite, the rest in `make test-all`
        (lambda p: _write(p / "d.jsonl", ['{"question": "a", "response": "b"}']), [], "question"),
        pytest.param(
            lambda p: _write(p / "d.jsonl", ['{"prompt": "a", "completion": "b"}', "{not json"]),
            [],
            "line 2",
            marks=pytest.mark.slow,
        ),
        pytest.param(
            lambda p: _write(p / "d.jsonl", ['{"prompt": "a", "completion": ""}']), [], "empty", marks=pytest.mark.slow
        ),
        pytest.param(
            lambda p: _write(p / "d.jsonl", ['{"messages": [{"role": "assistant", "content": "x"}]}']),
            [],
            "row",
            marks=pytest.mark.slow,
        ),
        pytest.param(
            lambda p: _write(p / "d.jsonl", ['{"prompt": "' + "x" * 100 + '", "completion": "b"}'] * 3),
            ["max_length=20", "overlong=error"],
            "3",
            marks=pytest.mark.slow,
        ),
        pytest.param(lambda p: None, ["model=./no/such/model"], "does not exist", marks=pytest.mark.slow),
    ],
    ids=["missing-columns", "malformed-row", "empty-completion", "bad-roles", "overlong", "missing-model"],
)
def test_bad_input_fails_at_startup_with_a_clear_message(tmp_path, make_data, overrides, message):
    data = make_data(tmp_path)
    args = ["sft", f"output_dir={tmp_path / 'run'}", *TINY, *overrides]
    if data is not None:
        args.append(f"dataset={data}")
    result = _run_cli(*args)
    assert result.returncode == 2, result.stderr[-2000:]
    assert "error:" in result.stdout and message in result.stdout, result.stdout
    assert "Traceback" not in result.stdout + result.stderr
    assert not (tmp_path / "run" / "metrics.jsonl").exists()  # nothing ran


def test_nan_loss_stops_and_keeps_last_good_checkpoint(tmp_path, monkeypatch):
    cfg = config(
        tmp_path,
        "task_args.digits=1",
        "train_rows=64",
        "eval_rows=8",
        "max_steps=10",
        "batch_size=8",
        "save_every=2",
        "eval_every=0",
    )
    real = sft_step.token_cross_entropy
    calls = {"n": 0}

    def poisoned(model, batch, dtype, *args):
        loss, n = real(model, batch, dtype, *args)
        calls["n"] += model.training  # count training steps only (evaluation runs in eval mode)
        return (loss * float("nan") if calls["n"] > 5 else loss), n  # step 6 diverges

    monkeypatch.setattr(sft_step, "token_cross_entropy", poisoned)
    with pytest.raises(common.TrainingDiverged, match="Loss is nan at step"):
        sft.train(cfg)
    last = common.latest_checkpoint(cfg.output_dir)
    assert last is not None and common.checkpoint_step(last) == 4
    state = common.read_state(last)
    weights = load_model(str(last))
    assert all(torch.isfinite(p).all() for p in weights.parameters())
    assert state["step"] == 4


def test_stop_at_accuracy_ends_training_at_the_first_eval_that_reaches_it(tmp_path, monkeypatch):
    accuracies = iter([0.0, 0.1, 0.3, 0.9, 0.9])  # initial eval, then steps 5, 10, ...; the final eval repeats 0.9

    def fake_accuracy(model, tokenizer, rows, max_new_tokens, dtype, num_samples=0, prompt_format=None):
        return {"accuracy": next(accuracies)}, []

    monkeypatch.setattr(sft_method, "task_accuracy", fake_accuracy)
    cfg = config(
        tmp_path,
        "task_args.digits=1",
        "train_rows=64",
        "eval_rows=8",
        "max_steps=50",
        "batch_size=8",
        "eval_every=5",
        "save_every=0",
        "log_every=1",
        "stop_at_accuracy=0.3",
    )
    result = sft.train(cfg)
    run = Path(cfg.output_dir)
    trained = [r["step"] for r in read_jsonl(run / "metrics.jsonl") if "loss" in r]
    assert max(trained) == 10  # the eval at step 10 read 0.3 >= 0.3
    assert (run / "checkpoints" / "step-10").exists() and (run / "final" / "config.json").exists()
    assert result["eval/accuracy"] == 0.9 and result["initial/eval/accuracy"] == 0.0


def test_stop_at_accuracy_needs_periodic_evals(tmp_path):
    with pytest.raises(ConfigError, match="eval_every"):
        config(tmp_path, "stop_at_accuracy=0.5", "eval_every=0")
