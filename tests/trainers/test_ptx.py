"""PPO-ptx: the ptx term adds exactly gamma x the gradient of the pretraining cross-entropy, it keeps the policy's
likelihood of the pretraining text where RL alone lets it drift, and eval/ptx_ce is logged with or without it."""

import pytest
import torch
import torch.nn.functional as F
from test_online import rl_config

from lmrl.config import ConfigError
from lmrl.data.tokenizers import build_char_tokenizer
from lmrl.models import load_model
from lmrl.tracking import read_jsonl
from lmrl.trainers import common
from lmrl.trainers.rl import trainer as online
from lmrl.trainers.rl.ptx import PretrainingMix


def test_the_ptx_term_adds_gamma_times_the_pretraining_gradient(tmp_path):
    config = rl_config(
        tmp_path, "grpo", "ptx_coef=0.25", "ptx_dataset=builtin:pydoc", "ptx_batch_size=3", "ptx_block_size=16"
    )
    tokenizer = build_char_tokenizer()
    model = load_model("builtin:tiny", tokenizer, model_args=config.model_args)
    mix = PretrainingMix(config, tokenizer)
    ce = mix.backward(model, position=2, dtype=None, chunk_mb=256)
    got = {n: p.grad.clone() for n, p in model.named_parameters()}
    model.zero_grad()
    windows = mix.train[common.epoch_batch_indices(len(mix.train), 3, 2, config.seed)]  # the batch at position 2
    logits = model(input_ids=windows[:, :-1]).logits
    expected_ce = F.cross_entropy(logits.flatten(0, 1), windows[:, 1:].flatten())
    (0.25 * expected_ce).backward()
    assert ce == pytest.approx(expected_ce.item(), rel=1e-5)
    for name, p in model.named_parameters():
        torch.testing.assert_close(got[name], p.grad, rtol=1e-4, atol=1e-7, msg=name)


def test_ptx_keeps_the_pretraining_likelihood_and_forgetting_is_logged(tmp_path):
    finals = {}
    for coef in (0.0, 1.0):
        out = tmp_path / str(coef)
        online.train(
            rl_config(
                out,
                "grpo",
                "max_steps=12",
                "eval_every=12",
                f"ptx_coef={coef}",
                "ptx_dataset=builtin:pydoc",
                "ptx_block_size=32",
                "ptx_batch_size=8",
            )
        )
        rows = read_jsonl(out / "grpo" / "metrics.jsonl")
        steps = [r for r in rows if r["step"] > 0 and "reward/mean" in r]
        assert all(("loss/ptx" in r) == (coef > 0) for r in steps)
        evals = [r["eval/ptx_ce"] for r in rows if "eval/ptx_ce" in r]
        assert len(evals) == 2  # step 0 and the last step, with or without the term
        finals[coef] = evals
    # same start; trained on the text, the ptx run ends with a lower cross-entropy on held-out text than RL alone
    assert finals[0.0][0] == pytest.approx(finals[1.0][0])
    assert finals[1.0][1] < finals[0.0][1] - 0.2, finals


def test_ptx_without_text_is_refused(tmp_path):
    with pytest.raises(ConfigError, match="ptx_dataset=builtin:pydoc"):
        rl_config(tmp_path, "grpo", "ptx_coef=0.5")
