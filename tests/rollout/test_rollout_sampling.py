"""top-k / top-p filters and next-token sampling, against hand-computed values."""

import math

import torch

from lmrl.rollout.engines.sampling import sample_next_token, top_k_filter, top_p_filter

NEG = float("-inf")


def test_top_k_keeps_k_largest_and_ties():
    scores = torch.tensor([[1.0, 3.0, 2.0, 0.0]])
    # k=2: the 2nd largest is 2.0 -> keep 3.0 and 2.0
    assert top_k_filter(scores, 2).tolist() == [[NEG, 3.0, 2.0, NEG]]
    # ties with the k-th value are kept: [1, 3, 2, 3], k=2 -> k-th largest is 3 -> keep both 3s
    tied = torch.tensor([[1.0, 3.0, 2.0, 3.0]])
    assert top_k_filter(tied, 2).tolist() == [[NEG, 3.0, NEG, 3.0]]
    assert torch.equal(top_k_filter(scores, 0), scores) and torch.equal(top_k_filter(scores, 4), scores)


def test_top_p_keeps_smallest_set_reaching_p():
    # probabilities 0.05, 0.5, 0.15, 0.3; descending: 0.5, 0.3, 0.15, 0.05 with mass before = 0, 0.5, 0.8, 0.95
    probs = torch.tensor([[0.05, 0.5, 0.15, 0.3]])
    scores = probs.log()
    kept = lambda p: torch.isfinite(top_p_filter(scores, p))[0].tolist()  # noqa: E731
    assert kept(0.7) == [False, True, False, True]  # 0.5 < 0.7 keep 0.3; 0.8 >= 0.7 drop 0.15
    assert kept(0.45) == [False, True, False, False]  # mass before 0.3 is 0.5 >= 0.45
    assert kept(0.85) == [False, True, True, True]  # mass before 0.05 is 0.95 >= 0.85
    assert kept(1e-9) == [False, True, False, False]  # the top token is always kept
    assert torch.equal(top_p_filter(scores, 1.0), scores)


def test_logp_is_under_full_temperature_scaled_distribution():
    # logits ln(1..4): at T=1 p = k/10; at T=0.5 z = 2 ln k so p = k^2/30
    logits = torch.tensor([[0.0, math.log(2), math.log(3), math.log(4)]])
    tok, logp = sample_next_token(logits, greedy=True)
    assert tok.tolist() == [3] and math.isclose(logp.item(), math.log(0.4), abs_tol=1e-6)
    tok, logp = sample_next_token(logits, temperature=0.5, greedy=True)
    assert tok.tolist() == [3] and math.isclose(logp.item(), math.log(16 / 30), abs_tol=1e-6)
    # top-k=1 samples the argmax; the stored log-prob is still under the full distribution (not log 1 = 0)
    tok, logp = sample_next_token(logits, temperature=0.5, top_k=1, generator=torch.Generator().manual_seed(0))
    assert tok.tolist() == [3] and math.isclose(logp.item(), math.log(16 / 30), abs_tol=1e-6)


def test_sampling_frequencies_match_probabilities():
    # 20000 draws from p = (0.1, 0.2, 0.3, 0.4): std of a frequency <= sqrt(0.25/20000) = 0.0035; tolerance 0.015
    rows = 20000
    logits = torch.tensor([0.1, 0.2, 0.3, 0.4]).log().expand(rows, 4)
    tok, logp = sample_next_token(logits, generator=torch.Generator().manual_seed(0))
    freq = torch.bincount(tok, minlength=4).float() / rows
    assert torch.allclose(freq, torch.tensor([0.1, 0.2, 0.3, 0.4]), atol=0.015)
    assert torch.allclose(logp, torch.tensor([0.1, 0.2, 0.3, 0.4]).log()[tok], atol=1e-6)
    # top_k=2 renormalises over {0.3, 0.4}: 3/7 and 4/7
    tok, _ = sample_next_token(logits, top_k=2, generator=torch.Generator().manual_seed(1))
    freq = torch.bincount(tok, minlength=4).float() / rows
    assert freq[:2].sum() == 0 and torch.allclose(freq[2:], torch.tensor([3 / 7, 4 / 7]), atol=0.015)
    # ... and when the filtered tokens are the last ones of the vocabulary (the inverse transform's upper edge)
    tok, _ = sample_next_token(logits.flip(-1), top_k=2, generator=torch.Generator().manual_seed(1))
    freq = torch.bincount(tok, minlength=4).float() / rows
    assert freq[2:].sum() == 0 and torch.allclose(freq[:2], torch.tensor([4 / 7, 3 / 7]), atol=0.015)
    # temperature 0.5 squares the probabilities: (1, 4, 9, 16) / 30
    tok, _ = sample_next_token(logits, temperature=0.5, generator=torch.Generator().manual_seed(2))
    freq = torch.bincount(tok, minlength=4).float() / rows
    assert torch.allclose(freq, torch.tensor([1, 4, 9, 16]) / 30.0, atol=0.015)


def test_same_seed_same_tokens_and_bf16_logits():
    logits = torch.randn(64, 50, generator=torch.Generator().manual_seed(3))
    a, _ = sample_next_token(logits, generator=torch.Generator().manual_seed(7))
    b, _ = sample_next_token(logits, generator=torch.Generator().manual_seed(7))
    c, _ = sample_next_token(logits, generator=torch.Generator().manual_seed(8))
    assert torch.equal(a, b) and not torch.equal(a, c)
    tok, logp = sample_next_token(logits.bfloat16(), greedy=True)
    ref = torch.log_softmax(logits.bfloat16().float(), -1)
    assert logp.dtype == torch.float32 and torch.allclose(logp, ref.gather(-1, tok[:, None])[:, 0], atol=1e-6)
