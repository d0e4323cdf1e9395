"""Stop strings: a row ends once its decoded completion contains one (`SamplingParams.stop_strings`), the same way in
both engines. `HFEngine` checks the running rows at every step (`StopStringMatcher`); vLLM samples token ids only, so
its finished rows are replayed through the same check afterwards (`apply_stop_strings`)."""

from __future__ import annotations

from collections.abc import Sequence

import torch


class StopStringMatcher:
    """Finds running rows whose decoded completion now contains a stop string.

    A stop string can only be completed by a token whose text contains the string's last character, so
    each step a (V,) lookup table selects the candidate rows (vectorised) and only those rows decode their
    last `window` tokens. Tokens that decode to nothing or to a partial UTF-8 character are always
    candidates; if a stop string ends in whitespace (which some tokenizers strip when decoding a lone
    token), every token is.
    """

    def __init__(self, tokenizer, stop_strings: Sequence[str], vocab_size: int, device: torch.device):
        self.tokenizer = tokenizer
        self.stop_strings = tuple(stop_strings)
        self.window = max(len(s) for s in self.stop_strings) + 2  # tokens; each real token is >= 1 character
        size = max(vocab_size, len(tokenizer))
        last_chars = {s[-1] for s in self.stop_strings}
        candidate = torch.zeros(size, dtype=torch.bool)
        if any(c.isspace() for c in last_chars):
            candidate[:] = True
        else:
            texts = tokenizer.batch_decode([[i] for i in range(len(tokenizer))], skip_special_tokens=True)
            flags = [t == "" or "\ufffd" in t or any(c in t for c in last_chars) for t in texts]
            candidate[: len(flags)] = torch.tensor(flags, dtype=torch.bool)
        self.candidate = candidate.to(device)  # (V,)

    def __call__(self, completion_ids: torch.Tensor, new_tokens: torch.Tensor, running: torch.Tensor) -> torch.Tensor:
        """BoolTensor (N,): rows in `running` whose completion (N, t) now contains a stop string."""
        hit = torch.zeros_like(running)
        rows = (running & self.candidate[new_tokens]).nonzero().squeeze(1)  # (n_cand,)
        if rows.numel() == 0:
            return hit
        tails = completion_ids[rows, -self.window :].tolist()
        texts = self.tokenizer.batch_decode(tails, skip_special_tokens=True)
        found = [any(s in text for s in self.stop_strings) for text in texts]
        hit[rows] = torch.tensor(found, dtype=torch.bool, device=hit.device)
        return hit

    def cut(self, text: str) -> tuple[str, bool]:
        """`text` cut before the earliest stop string, and whether one was found."""
        cuts = [i for i in (text.find(s) for s in self.stop_strings) if i >= 0]
        return (text[: min(cuts)], True) if cuts else (text, False)


def apply_stop_strings(
    matcher: StopStringMatcher, out_ids: torch.Tensor, lengths: torch.Tensor, stopped: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor]:
    """Replay `HFEngine`'s per-step stop-string check on finished rows: (N, T) ids, lengths (N,), stopped (N,) ->
    new lengths and stopped. A row ends at the first step whose decoded tail contains a stop string."""
    lengths, stopped = lengths.clone(), stopped.clone()
    done = torch.zeros_like(stopped)  # (N,)
    for step in range(out_ids.shape[1]):
        running = (step < lengths) & ~done  # (N,)
        if not running.any():
            break
        lo = max(0, step + 1 - matcher.window)
        hit = matcher(out_ids[:, lo : step + 1], out_ids[:, step], running)  # (N,)
        lengths[hit], stopped[hit] = step + 1, True
        done |= hit | (step + 1 >= lengths)
    return lengths, stopped
