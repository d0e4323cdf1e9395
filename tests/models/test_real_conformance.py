"""lmrl's outputs on a real model equal plain transformers': SmolLM2-135M-Instruct of `make smollm2` (skipped when it
is not installed; `make test-portable` installs it and runs this under other CPU kernels and thread counts).

Greedy tokens: lmrl's engine against ``model.generate``, for a chat prompt (its template) and a raw one. Where the
two pick different tokens, the model's own top two logits at that position must be within rounding of each other
(a true tie that float order may break either way); anywhere else the first difference fails. Log-probs: the
sampler's and the learner's (`completion_logprobs`, with lmrl's speed-ups: shared prompts, the chunked LM head)
against log_softmax of one plain forward, within sqrt(hidden) * layers fp32 roundoffs of their scale. `final/` as
lmrl saves it loads in plain transformers with the model's own tokenizer and generates the same tokens.
"""

import pytest
import torch
from transformers import AutoModelForCausalLM, AutoTokenizer

from lmrl.data.prompt_format import PromptFormat
from lmrl.models.forward_plan import ForwardPlan, completion_logprobs
from lmrl.models.saving import save_model
from lmrl.numerics import agreement, model_ulps, rounding_bound, unit_roundoff
from lmrl.rollout import HFEngine, SamplingParams

NEW_TOKENS = 12
PROMPTS = [(True, "What is the capital of France?"), (False, "The capital of France is")]


def plain_logits(model, ids: list[int]) -> torch.Tensor:
    with torch.no_grad():
        return model(input_ids=torch.tensor([ids]), use_cache=False).logits[0].float()


def assert_same_greedy(model, prompt: list[int], ours: list[int], theirs: list[int]) -> None:
    """Equal, or different only after a position where the model's top two logits tie up to rounding."""
    if ours == theirs:
        return
    j = next((i for i, (a, b) in enumerate(zip(ours, theirs)) if a != b), min(len(ours), len(theirs)))
    logits = plain_logits(model, prompt + theirs[:j])[-1]
    top = logits.topk(2).values
    tie = model_ulps(model) * unit_roundoff(torch.float32) * logits.abs().max().item()
    assert (top[0] - top[1]).item() <= tie, f"greedy tokens differ at {j}: {ours} vs {theirs}"


@pytest.mark.portable
@pytest.mark.parametrize("chat, text", PROMPTS, ids=["chat", "raw"])
def test_greedy_tokens_and_log_probs_equal_plain_transformers(smollm2, chat, text):
    model, tokenizer = smollm2
    prompt = PromptFormat(chat).ids(tokenizer, text)
    batch = HFEngine(model, tokenizer).generate([prompt], SamplingParams(max_new_tokens=NEW_TOKENS, greedy=True))
    n = int(batch.completion_mask[0].sum())
    ours = batch.completion_ids[0, :n].tolist()
    out = model.generate(
        torch.tensor([prompt]),
        do_sample=False,
        max_new_tokens=NEW_TOKENS,
        pad_token_id=tokenizer.pad_token_id,
        eos_token_id=model.generation_config.eos_token_id,
    )
    theirs = out[0, len(prompt) :].tolist()
    theirs = theirs[: theirs.index(tokenizer.eos_token_id) + 1] if tokenizer.eos_token_id in theirs else theirs
    assert_same_greedy(model, prompt, ours, theirs)

    plain = (
        plain_logits(model, prompt + ours)
        .log_softmax(-1)[len(prompt) - 1 : -1]
        .gather(-1, torch.tensor(ours)[:, None])[:, 0]
    )
    bound = rounding_bound(plain, [], dtype=torch.float32, floor_ulps=model_ulps(model))
    sampler = batch.sampler_logp[0, :n].float()
    assert agreement(sampler, plain, bound), f"sampler log-probs: {agreement(sampler, plain, bound)}"
    ids = torch.tensor([prompt + ours] * 2)  # two rows of one prompt: the shared-prompt forward runs
    mask = torch.ones_like(ids)
    with torch.no_grad():
        learner = completion_logprobs(model, ids, mask, len(prompt), ForwardPlan(share_prompts=True, chunk_mb=0.5))
    for row in learner.float():
        assert agreement(row, plain, bound), f"learner log-probs: {agreement(row, plain, bound)}"


def test_final_loads_in_plain_transformers_with_the_models_own_tokenizer(smollm2, tmp_path):
    model, tokenizer = smollm2
    final = save_model(model, tokenizer, tmp_path / "final")
    theirs_model = AutoModelForCausalLM.from_pretrained(final).eval()
    theirs_tok = AutoTokenizer.from_pretrained(final)
    assert len(theirs_tok) == len(tokenizer) == theirs_model.config.vocab_size
    text = "What is the capital of France?"
    ids = PromptFormat().ids(tokenizer, text)
    assert PromptFormat().ids(theirs_tok, text) == ids  # the saved tokenizer and template give the same ids
    greedy = dict(do_sample=False, max_new_tokens=NEW_TOKENS, pad_token_id=tokenizer.pad_token_id)
    with torch.no_grad():
        a = model.generate(torch.tensor([ids]), **greedy)[0].tolist()
        b = theirs_model.generate(torch.tensor([ids]), **greedy)[0].tolist()
    assert_same_greedy(model, ids, a[len(ids) :], b[len(ids) :])
