"""Distillation: the student moves towards the teacher offline and on-policy, accumulation is exact, bad input is
refused at start-up."""

import pytest
import torch
from transformers import LlamaForCausalLM

from lmrl.config import ConfigError, load_config
from lmrl.data.tokenizers import build_char_tokenizer
from lmrl.models import load_model
from lmrl.models.loading import builtin_config
from lmrl.tracking import read_jsonl
from lmrl.trainers.distill import trainer as distill
from tests.helpers import DISTILL_RUN, TINY, TINY_ARGS


@pytest.fixture(scope="module")
def teacher_dir(tmp_path_factory):
    """A teacher that differs from the student: the same tiny architecture from another seed."""
    path = tmp_path_factory.mktemp("teacher")
    tokenizer = build_char_tokenizer()
    load_model("builtin:tiny", tokenizer, seed=7, model_args=TINY_ARGS).save_pretrained(path)
    tokenizer.save_pretrained(path)
    return path


def config(tmp_path, teacher, *overrides):
    base = [
        f"output_dir={tmp_path / 'run'}",
        f"teacher={teacher}",
        "precision=fp32",
        *TINY,
        "task_args.digits=1",
        "train_rows=64",
        "eval_rows=16",
        *DISTILL_RUN,
    ]
    return load_config(distill.DistillConfig, None, [*base, *overrides])


# on-policy (sampling every step) takes ~1-1.5 min on 2 shared cores: slow; offline KD stays in the default suite
@pytest.mark.parametrize("on_policy_frac", [0.0, pytest.param(1.0, marks=pytest.mark.slow)])
def test_the_student_moves_towards_the_teacher(tmp_path, teacher_dir, on_policy_frac):
    cfg = config(tmp_path, teacher_dir, f"on_policy_frac={on_policy_frac}", "max_steps=25", "eval_every=25")
    final = distill.train(cfg)
    for direction in ("forward", "reverse"):  # held-out KL between the two models, both directions
        assert final[f"eval/kl_{direction}"] < 0.5 * final[f"initial/eval/kl_{direction}"], final
    steps = [r for r in read_jsonl(tmp_path / "run" / "metrics.jsonl") if "loss" in r and r["step"] > 0]
    trained_on = "loss/kl_reverse" if on_policy_frac else "loss/kl_forward"
    assert all(trained_on in r for r in steps) and steps[-1]["loss"] < 0.5 * steps[0]["loss"]
    assert ("time/rollout_s" in steps[0]) == bool(on_policy_frac)


def test_mixed_batches_use_both_divergences_and_accumulation_is_exact(tmp_path, teacher_dir, monkeypatch):
    grads = []  # the gradient of step 1, taken where the optimizer would step
    monkeypatch.setattr(
        distill.common,
        "optimizer_step",
        lambda model, *a: grads.append({n: p.grad.clone() for n, p in model.named_parameters()}) or 0.0,
    )
    for accum in (1, 2):
        cfg = config(tmp_path / str(accum), teacher_dir, "on_policy_frac=0.5", f"grad_accum={accum}")
        metrics = distill.Distill(cfg, distill.ModelSetup.from_config(cfg)).step(1)
        assert metrics["rollout/on_policy_rows"] == 4 and {"loss/kl_forward", "loss/kl_reverse"} <= metrics.keys()
    for name in grads[0]:
        torch.testing.assert_close(grads[0][name], grads[1][name], rtol=1e-4, atol=1e-6, msg=name)


def test_bad_input_is_refused_before_training(tmp_path, teacher_dir):
    with pytest.raises(ConfigError, match="needs a teacher"):
        load_config(distill.DistillConfig, None, [f"output_dir={tmp_path}"])
    with pytest.raises(ConfigError, match="on_policy_frac"):
        config(tmp_path, teacher_dir, "on_policy_frac=1.5")
    with pytest.raises(FileNotFoundError, match=r"'teacher' .* does not exist.* To make one: `lmrl demo"):
        distill.train(config(tmp_path, tmp_path / "no-teacher"))  # named as the key, not as a missing model
    other = tmp_path / "other"
    tokenizer = build_char_tokenizer()
    LlamaForCausalLM(
        builtin_config("builtin:tiny", 120, tokenizer.pad_token_id, tokenizer.eos_token_id, **TINY_ARGS)
    ).save_pretrained(other)
    with pytest.raises(ValueError, match="vocabulary of 120 tokens but the student has"):
        distill.train(config(tmp_path, other))
    assert not (tmp_path / "run").exists()
