"""Multiple choice by log-likelihood: batched rows (left-padded contexts) equal one row at a time, and the picks."""

from __future__ import annotations

import pytest
import torch

from lmrl.data.chat import encode_prompt
from lmrl.data.tokenizers import build_char_tokenizer
from lmrl.eval.loglik import batch_logprobs, choice_logprobs, evaluate_choices
from lmrl.models import load_model
from tests.helpers import TINY_ARGS

ROWS = [
    {"prompt": "2+3=", "choices": ["5", "6", "17"], "answer": "5"},
    {"prompt": "14+41=", "choices": ["55", "56"], "answer": 0},
    {"prompt": "9-1=", "choices": ["8", "10", "-8", "7"], "answer": 3},
]


def test_batched_rows_equal_single_rows_and_a_manual_sum():
    tok = build_char_tokenizer()
    model = load_model("builtin:tiny", tok, seed=5, model_args=TINY_ARGS).eval()
    contexts = [encode_prompt(tok, r["prompt"], chat=True) for r in ROWS]
    sums, counts = batch_logprobs(model, tok, [(c, r["choices"]) for c, r in zip(contexts, ROWS)])
    for context, row, s, n in zip(contexts, ROWS, sums, counts):
        single, single_n = choice_logprobs(model, tok, context, row["choices"])
        assert s == pytest.approx(single, abs=1e-4) and n == single_n
    # by hand: log p of "55" after the context = log p("5"|ctx) + log p("5"|ctx, "5")
    ids = contexts[1] + list(tok("55", add_special_tokens=False)["input_ids"])
    with torch.no_grad():
        logp = torch.log_softmax(model(torch.tensor([ids])).logits[0].float(), -1)
    p = len(contexts[1])
    manual = sum(logp[p - 1 + j, ids[p + j]].item() for j in range(len(ids) - p))
    assert sums[1][0] == pytest.approx(manual, abs=1e-4)
    metrics, records = evaluate_choices(model, tok, ROWS, batch_size=2)
    picks = [max(range(len(s)), key=lambda i: s[i]) for s in sums]
    golds = [0, 0, 3]
    assert [r["pick"] for r in records] == picks
    assert metrics["loglik/acc"] == pytest.approx(sum(p == g for p, g in zip(picks, golds)) / 3)
    norm = [max(range(len(s)), key=lambda i: s[i] / n[i]) for s, n in zip(sums, counts)]
    assert metrics["loglik/acc_norm"] == pytest.approx(sum(p == g for p, g in zip(norm, golds)) / 3)
