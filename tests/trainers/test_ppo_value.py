"""PPO's value-loss term: its normalisation makes a minibatch split into parts (micro-batches or processes) sum
to the whole minibatch's loss, whatever the parts' lengths."""

from __future__ import annotations

import dataclasses

import torch

from lmrl.algorithms import value_loss
from lmrl.data.tokenizers import build_char_tokenizer
from lmrl.models import load_model
from lmrl.models.value import ValueModel
from lmrl.trainers.ppo_value import completion_values, value_term
from tests.helpers import ONE_LAYER_ARGS


@dataclasses.dataclass
class Rows:
    """The fields of a `RolloutBatch` that the value term reads: prompt (N, P) then completion (N, T)."""

    prompt_ids: torch.Tensor
    completion_ids: torch.Tensor
    input_ids: torch.Tensor
    attention_mask: torch.Tensor
    train_mask: torch.Tensor

    def __len__(self) -> int:
        return len(self.input_ids)

    def part(self, rows: torch.Tensor) -> Rows:
        return Rows(*(getattr(self, f.name)[rows] for f in dataclasses.fields(self)))


def test_the_value_loss_of_a_split_minibatch_sums_to_the_whole_minibatch_loss():
    torch.manual_seed(0)
    model = load_model(
        "builtin:tiny",
        build_char_tokenizer(),
        seed=0,
        model_args=ONE_LAYER_ARGS,
    )
    value_model = ValueModel.from_causal_lm(model)
    torch.nn.init.normal_(value_model.head.weight, std=0.5)
    lengths = torch.tensor([5, 1, 3, 2])  # parts [0, 1] and [2, 3]: 6 and 5 tokens, 2 rows each
    mask = (torch.arange(5)[None, :] < lengths[:, None]).float()  # (4, 5) right-padded completions
    ids = torch.randint(3, 50, (4, 8))
    rows = Rows(ids[:, :3], ids[:, 3:], ids, torch.cat([torch.ones(4, 3), mask], 1).long(), mask)
    with torch.no_grad():
        old = completion_values(value_model, rows, None)
    returns = torch.randn(4, 5) * mask
    whole, _ = value_term(value_model, rows, old, returns, 0.2, None, mb_rows=4)
    halves = [torch.tensor([0, 1]), torch.tensor([2, 3])]
    parts = sum(value_term(value_model, rows.part(i), old[i], returns[i], 0.2, None, mb_rows=4)[0] for i in halves)
    torch.testing.assert_close(parts, whole, atol=1e-7, rtol=1e-6)
    # weighting each part's mean by its share of the tokens (the policy's token_mean weight) is another loss
    by_tokens = sum(
        value_loss(completion_values(value_model, rows.part(i), None), old[i], returns[i], mask[i])[0]
        * mask[i].sum()
        / mask.sum()
        for i in halves
    )
    assert abs(float(by_tokens - whole)) > 1e-3 * abs(float(whole))
