"""A scalar head on a causal LM's backbone: the PPO value model (and, later, reward models).

``ValueModel(backbone)(input_ids, attention_mask) -> (N, L)`` gives one scalar per
position: the value of the state after reading tokens ``<= t``.
"""

from __future__ import annotations

import copy

import torch
from torch import nn

from lmrl.models.hf_compat import no_cache


def backbone_of(causal_lm: nn.Module) -> nn.Module:
    """The decoder stack of an HF causal LM (``model.model`` for Llama, ``transformer`` for GPT-2); through a peft
    wrapper, the decoder with its LoRA layers."""
    if hasattr(causal_lm, "get_base_model"):
        causal_lm = causal_lm.get_base_model()
    base = getattr(causal_lm, "base_model", None)
    if base is None or base is causal_lm:
        raise ValueError(f"{type(causal_lm).__name__} has no separate backbone (base_model) to put a value head on.")
    return base


class ValueModel(nn.Module):
    """Backbone + ``Linear(hidden, 1)``; the head starts at zero so initial values are 0."""

    def __init__(self, backbone: nn.Module, hidden_size: int):
        super().__init__()
        self.backbone = backbone
        self.head = nn.Linear(hidden_size, 1)
        nn.init.zeros_(self.head.weight)
        nn.init.zeros_(self.head.bias)

    @classmethod
    def from_causal_lm(cls, causal_lm: nn.Module) -> ValueModel:
        """A value model whose backbone is a copy of ``causal_lm``'s (PPO: init from the policy or a reward model)."""
        return cls(copy.deepcopy(backbone_of(causal_lm)), causal_lm.config.hidden_size)

    def forward(self, input_ids: torch.Tensor, attention_mask: torch.Tensor) -> torch.Tensor:
        position_ids = (attention_mask.long().cumsum(-1) - 1).clamp(min=0)  # left padding
        hidden = self.backbone(
            input_ids=input_ids, attention_mask=attention_mask, position_ids=position_ids, **no_cache(self.backbone)
        ).last_hidden_state  # no KV cache: a training forward reads none (and checkpointing would append twice)
        return self.head(hidden.float()).squeeze(-1)  # (N, L)
