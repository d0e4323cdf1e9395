"""What lmrl can train, checked on the loaded model at start-up: one line naming the model and the fix, not a
traceback minutes into a run.

lmrl trains decoder-only causal LMs: a token's logits may depend only on the tokens before it. Some configs load
through ``AutoModelForCausalLM`` without being one (BERT loads as ``BertLMHeadModel`` with ``is_decoder=False`` and
attends both ways), so the check is behavioural: two 5-token inputs that differ only in the last token must give
the same logits at the first four positions, up to rounding. How much rounding depends on the CPU and its threads
(2.0e-4 on a 2-core AMD EPYC, 0 on an Intel Xeon, for SmolLM2's fp32 logits), so the bound is measured on the model
itself (`lmrl.numerics.rounding_bound`): the first input's logits computed again as the second row of a batch (another
float order), and a floor of sqrt(hidden) * layers roundoffs of the logits' scale. A bidirectional model's logits move
by O(1) of their scale.
"""

from __future__ import annotations

import torch

from lmrl.models.hf_compat import no_cache
from lmrl.models.modes import evaluating
from lmrl.numerics import Agreement, agreement, compute_dtype, model_ulps, rounding_bound

__all__ = ["check_causal_lm"]

FIX = "lmrl trains decoder-only causal LMs (GPT-2, Llama, Qwen, Mistral, Gemma, Phi, OLMo, ...): pick one of those"


def check_causal_lm(model: torch.nn.Module, name: str) -> Agreement:
    """Raise ValueError unless ``model`` runs a forward and is causal (see the module docstring); returns the
    comparison that decided it."""
    hf_config = getattr(model, "config", None)  # transformers' config: its keys vary by architecture
    kind = getattr(hf_config, "model_type", type(model).__name__)
    if getattr(hf_config, "is_encoder_decoder", False):
        raise ValueError(f"Model '{name}' ({kind}) is an encoder-decoder model. {FIX}.")
    vocab = model.get_input_embeddings().num_embeddings
    device = next(model.parameters()).device
    ids = (torch.arange(1, 6, device=device) % vocab).repeat(2, 1)  # (2, 5)
    ids[1, -1] = (ids[1, -1] + 1) % vocab  # row 1 differs in its last token only
    try:
        with torch.no_grad(), evaluating(model):
            logits = lambda x: model(input_ids=x, **no_cache(model)).logits.float()[:, :4]  # noqa: E731
            first, second = logits(ids[:1])[0], logits(ids[1:])[0]
            again = logits(ids.flip(0))[1]  # the first input again, as row 1 of a batch of 2
    except Exception as exc:  # noqa: BLE001 - any failure of the model's own forward is the message
        first_line = (str(exc).strip().splitlines() or [""])[0][:200]
        raise ValueError(
            f"Model '{name}' ({kind}) failed a 5-token forward ({type(exc).__name__}: {first_line}). {FIX}."
        ) from exc
    bound = rounding_bound(first, [again], dtype=compute_dtype(model), floor_ulps=model_ulps(model))
    outcome = agreement(first, second, bound)
    if not outcome:
        raise ValueError(
            f"Model '{name}' ({kind}) is not a causal LM: its logits at a position change with later tokens "
            f"({outcome}). {FIX}."
        )
    return outcome
