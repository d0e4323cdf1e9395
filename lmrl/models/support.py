"""What lmrl can train, checked on the loaded model at start-up: one line naming the model and the fix, not a
traceback minutes into a run.

lmrl trains decoder-only causal LMs: a token's logits may depend only on the tokens before it. Some configs load
through ``AutoModelForCausalLM`` without being one (BERT loads as ``BertLMHeadModel`` with ``is_decoder=False`` and
attends both ways), so the check is behavioural: two 5-token inputs that differ only in the last token must give
the same logits at the first four positions.
"""

from __future__ import annotations

import torch

from lmrl.models.hf_compat import no_cache
from lmrl.models.modes import evaluating

__all__ = ["check_causal_lm"]

FIX = "lmrl trains decoder-only causal LMs (GPT-2, Llama, Qwen, Mistral, Gemma, Phi, OLMo, ...): pick one of those"


def check_causal_lm(model: torch.nn.Module, name: str) -> None:
    """Raise ValueError unless ``model`` runs a forward and is causal (see the module docstring)."""
    config = getattr(model, "config", None)
    kind = getattr(config, "model_type", type(model).__name__)
    if getattr(config, "is_encoder_decoder", False):
        raise ValueError(f"Model '{name}' ({kind}) is an encoder-decoder model. {FIX}.")
    vocab = model.get_input_embeddings().num_embeddings
    device = next(model.parameters()).device
    ids = (torch.arange(1, 6, device=device) % vocab).repeat(2, 1)  # (2, 5)
    ids[1, -1] = (ids[1, -1] + 1) % vocab  # row 1 differs in its last token only
    try:
        with torch.no_grad(), evaluating(model):
            logits = model(input_ids=ids, **no_cache(model)).logits.float()
    except Exception as exc:  # noqa: BLE001 - any failure of the model's own forward is the message
        first = (str(exc).strip().splitlines() or [""])[0][:200]
        raise ValueError(
            f"Model '{name}' ({kind}) failed a 5-token forward ({type(exc).__name__}: {first}). {FIX}."
        ) from exc
    if not torch.allclose(logits[0, :4], logits[1, :4], rtol=1e-4, atol=1e-4):
        raise ValueError(
            f"Model '{name}' ({kind}) is not a causal LM: its logits at a position change with later tokens. {FIX}."
        )
