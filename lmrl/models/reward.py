"""Reward models: a causal LM's backbone plus a linear head (RLHF book ch. 5, `spec/rlhf-book-core.md` §3).

Kinds:
  bt   Bradley-Terry / Plackett-Luce preference RM: one scalar at the last real token (N,);
  orm  outcome RM: one logit per token (N, L), p(correct) = σ(logit), trained with per-token BCE;
  prm  process RM: 3 class logits per token (N, L, 3) for step labels −1/0/+1 (ids 0/1/2).

The last real token is found from the attention mask, so left and right padding both work; positions
are `cumsum(mask) − 1` as in generation. The head runs in fp32 outside autocast.

A saved reward model is an HF causal-LM directory (config.json, weights, tokenizer: `load_model`
reads it, e.g. to start a PPO value model or a policy from it) plus `reward_head.safetensors` and
`reward_model.json` (kind, number of labels, chat flag). `load_reward_model(path)` reads both.
"""

from __future__ import annotations

import json
from pathlib import Path

import torch
from torch import nn

from lmrl.models.hf_compat import accepts_kwarg
from lmrl.models.value import backbone_of

HEAD_FILE = "reward_head.safetensors"
CONFIG_FILE = "reward_model.json"
KINDS = {"bt": 1, "orm": 1, "prm": 3}
"""Reward-model kinds and their head widths."""


def last_token_index(attention_mask: torch.Tensor) -> torch.Tensor:
    """(N,) index of each row's last attended position, for left or right padding."""
    positions = torch.arange(attention_mask.shape[1], device=attention_mask.device)  # (L,)
    if bool((attention_mask.sum(dim=1) == 0).any()):
        raise ValueError("last_token_index: a row of attention_mask is all zeros; an empty sequence has no last token.")
    return (positions[None, :] * (attention_mask != 0)).argmax(dim=1)  # (N,)


class RewardModel(nn.Module):
    """Causal LM backbone + `score = Linear(hidden, C)`.

    The LM's own submodules are registered on this module, so its state_dict is the LM's plus
    `score.weight`/`score.bias`: checkpoints written by `save_pretrained` restore with
    `lmrl.trainers.common.restore_checkpoint` like any model. The LM head is kept (unused in the
    forward) so the saved directory stays a loadable causal LM.
    """

    def __init__(self, causal_lm: nn.Module, kind: str = "bt", chat: bool = True, seed: int = 0):
        super().__init__()
        if kind not in KINDS:
            raise ValueError(f"reward model kind must be one of {sorted(KINDS)}, got {kind!r}.")
        backbone_of(causal_lm)  # fails early for models without a separate backbone
        for name, child in causal_lm.named_children():
            self.add_module(name, child)
        self._lm = [causal_lm]  # a list keeps the LM out of the registered children (no duplicate keys)
        self.config = causal_lm.config
        self.kind, self.chat = kind, chat
        hidden = causal_lm.config.hidden_size
        self.score = nn.Linear(hidden, KINDS[kind])
        with torch.random.fork_rng():  # the head's init depends on `seed` only, not on the global RNG
            torch.manual_seed(seed)
            # Stiennon et al. 2020 (App. B): reward head drawn from N(0, 1/(d_model + 1)).
            nn.init.normal_(self.score.weight, std=(hidden + 1) ** -0.5)
        nn.init.zeros_(self.score.bias)
        self.score.to(next(causal_lm.parameters()).device)  # drawn on the CPU (the same head on any device)

    @property
    def causal_lm(self) -> nn.Module:
        return self._lm[0]

    def forward(
        self, input_ids: torch.Tensor, attention_mask: torch.Tensor | None, position_ids: torch.Tensor | None = None
    ) -> torch.Tensor:
        """Head outputs at every position, fp32: (N, L, C). Padded rows take an ``attention_mask``; packed rows
        (`lmrl.data.packing`) take ``position_ids`` restarting per row and no mask."""
        if position_ids is None:
            position_ids = (attention_mask.long().cumsum(-1) - 1).clamp(min=0)  # (N, L); left padding safe
        backbone = backbone_of(self.causal_lm)
        # no KV cache: it is never read here, and HF reads restarting position ids as packed rows only without one
        extra = {"use_cache": False} if accepts_kwarg(backbone, "use_cache") else {}
        hidden = backbone(
            input_ids=input_ids, attention_mask=attention_mask, position_ids=position_ids, **extra
        ).last_hidden_state  # (N, L, H)
        with torch.autocast(device_type=hidden.device.type, enabled=False):
            return self.score(hidden.float())  # (N, L, C)

    def token_logits(self, input_ids: torch.Tensor, attention_mask: torch.Tensor) -> torch.Tensor:
        """ORM: (N, L) logits; PRM: (N, L, 3) class logits; BT: (N, L) per-prefix rewards."""
        out = self(input_ids, attention_mask)
        return out.squeeze(-1) if out.shape[-1] == 1 else out

    def rewards(self, input_ids: torch.Tensor, attention_mask: torch.Tensor) -> torch.Tensor:
        """(N,) head output at each row's last real token (BT reward; ORM logit of p(correct))."""
        if KINDS[self.kind] != 1:
            raise ValueError(f"rewards() needs a scalar head; a {self.kind!r} model has {KINDS[self.kind]} classes.")
        out = self(input_ids, attention_mask)[..., 0]  # (N, L)
        return out.gather(1, last_token_index(attention_mask)[:, None]).squeeze(1)  # (N,)

    def save_pretrained(self, path: str | Path, state_dict: dict[str, torch.Tensor] | None = None) -> None:
        """The causal LM in HF format, plus the head and `reward_model.json`. ``state_dict``: this module's full
        weights to save instead of its own (a sharded model's, gathered)."""
        from safetensors.torch import save_file

        path = Path(path)
        lm = self.causal_lm
        if state_dict is not None:
            # the LM's children are this module's own: its keys are the LM's, plus score.*
            lm.save_pretrained(path, state_dict={k: v for k, v in state_dict.items() if not k.startswith("score.")})
            head = {k: v for k, v in state_dict.items() if k.startswith("score.")}
        else:
            if hasattr(lm, "merge_and_unload"):  # LoRA: a reward model directory always holds full weights
                from lmrl.models.lora import merged_copy

                lm = merged_copy(lm)
            lm.save_pretrained(path)
            head = {f"score.{k}": v for k, v in self.score.state_dict().items()}
        save_file({k: v.detach().contiguous() for k, v in head.items()}, path / HEAD_FILE)
        info = {"format": "lmrl-reward-model", "kind": self.kind, "num_labels": KINDS[self.kind], "chat": self.chat}
        (path / CONFIG_FILE).write_text(json.dumps(info, indent=2) + "\n")


def is_reward_model(path: str | Path) -> bool:
    return (Path(path) / CONFIG_FILE).is_file() and (Path(path) / HEAD_FILE).is_file()


def load_reward_model(path: str | Path):
    """(RewardModel in eval mode, tokenizer) from a directory written by `RewardModel.save_pretrained`."""
    from safetensors.torch import load_file

    from lmrl.data.tokenizers import load_tokenizer
    from lmrl.models.loading import load_model

    path = Path(path)
    if not is_reward_model(path):
        what = "does not exist" if not path.exists() else f"has no {CONFIG_FILE} and {HEAD_FILE}"
        raise FileNotFoundError(
            f"Reward model '{path}' {what}. Give the final/ directory (or a checkpoints/step-N/ directory) of a "
            f"run of `lmrl reward`, e.g. runs/reward/final."
        )
    info = json.loads((path / CONFIG_FILE).read_text())
    tokenizer = load_tokenizer(str(path))
    model = RewardModel(load_model(str(path)), kind=info["kind"], chat=bool(info.get("chat", True)))
    head = load_file(path / HEAD_FILE)
    model.score.load_state_dict({k.removeprefix("score."): v for k, v in head.items()})
    return model.eval(), tokenizer
