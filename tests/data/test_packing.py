"""Packing: first-fit-decreasing bins, rank balancing, position ids and labels, and the model check that catches a
model attending across packed rows."""

import sys
from pathlib import Path

import pytest
import torch

from lmrl.data import packing
from lmrl.data.tokenizers import build_char_tokenizer

sys.path.insert(0, str(Path(__file__).parents[1] / "models"))
from arch_zoo import build_model  # noqa: E402

pytestmark = pytest.mark.portable  # `make test-portable`: again under other CPU kernels and threads


def test_first_fit_decreasing_by_hand():
    # longest first: 7 -> bin0 (room 3); 5 -> bin1 (room 5); 4 -> bin1 (room 1); 3 -> bin0 (room 0); 2 -> bin2
    assert packing.first_fit_decreasing([3, 7, 2, 5, 4], capacity=10) == [[1, 0], [3, 4], [2]]


def test_every_row_lands_in_exactly_one_bin_within_capacity():
    lengths = torch.randint(1, 50, (200,), generator=torch.Generator().manual_seed(0)).tolist()
    bins = packing.first_fit_decreasing(lengths, capacity=64)
    assert sorted(i for b in bins for i in b) == list(range(200))
    assert all(sum(lengths[i] for i in b) <= 64 for b in bins)
    assert len(bins) <= -(-sum(lengths) // 64) * 11 // 9 + 1  # FFD's bound over the lower bound


def test_a_row_longer_than_the_capacity_names_the_key():
    with pytest.raises(ValueError, match="max_tokens_per_microbatch=4"):
        packing.first_fit_decreasing([3, 5], capacity=4)


def test_balance_evens_tokens_and_bin_counts():
    lengths = [10, 9, 8, 3, 2, 1]
    bins = [[0], [1], [2], [3], [4], [5]]
    # largest first to the least-loaded rank with < 3 bins: 10 -> r0, 9 -> r1, 8 -> r1 (17), 3 -> r0 (13),
    # 2 -> r0 (15, full), 1 -> r1 (18)
    ranks = packing.balance(bins, lengths, world=2)
    assert sorted(len(r) for r in ranks) == [3, 3]
    loads = [sum(lengths[i] for b in r for i in b) for r in ranks]
    assert loads == [15, 18]  # r0: 10, 3, 2; r1: 9, 8, 1
    assert packing.balance([[0], [1], [2]], [5, 4, 3], world=2) == [[[0]], [[1], [2]]]


def test_pack_restarts_positions_and_never_trains_a_row_boundary():
    batch = packing.pack([[5, 6, 7], [8, 9]], [[-100, 6, 7], [8, 9]])
    assert batch["input_ids"].tolist() == [[5, 6, 7, 8, 9]]
    assert batch["position_ids"].tolist() == [[0, 1, 2, 0, 1]]
    assert batch["labels"].tolist() == [[-100, 6, 7, -100, 9]]  # 8 would be predicted from row 0's last token
    assert batch["row_ids"].tolist() == [[0, 0, 0, 1, 1]]


@pytest.mark.parametrize("arch, agrees", [("llama", True), ("gpt2", True), ("opt-dropout", False)])
def test_the_model_check_catches_attention_across_rows(arch, agrees):
    tokenizer = build_char_tokenizer()
    model = build_model(arch, tokenizer)
    assert packing.packed_forward_agrees(model, len(tokenizer)) is agrees  # OPT's positions come from the mask


def test_the_model_check_accepts_logits_that_differ_by_rounding():
    """Another CPU rounds the packed and the lone rows' products differently: still the same model (a leak is O(1))."""
    from tests.rounding import add_rounding_noise

    tokenizer = build_char_tokenizer()
    model = build_model("llama", tokenizer)
    with torch.no_grad():
        model.get_output_embeddings().weight.mul_(100)  # logits of a real model's scale: noise of ~1e-4 and above
    add_rounding_noise(model.get_output_embeddings())
    assert packing.packed_forward_agrees(model, len(tokenizer))


def test_sft_refuses_packing_for_a_model_that_attends_across_rows(tmp_path):
    from arch_zoo import save_model_dir

    from lmrl.config import load_config
    from lmrl.trainers.sft import trainer as sft

    model_dir = save_model_dir("opt-dropout", tmp_path / "opt")
    config = load_config(
        sft.SFTConfig,
        None,
        [
            f"output_dir={tmp_path / 'run'}",
            f"model={model_dir}",
            "max_tokens_per_microbatch=256",
            "train_rows=8",
            "precision=fp32",
        ],
    )
    with pytest.raises(ValueError, match="OPTForCausalLM attends across packed rows"):
        sft.train(config)
    assert not (tmp_path / "run" / "final").exists()
