"""RolloutBatch (shapes, properties, select) and SamplingParams validation."""

import pytest
import torch

from lmrl.rollout.types import RolloutBatch, SamplingParams

PAD = 0


def make_batch(num_prompts: int = 3, group: int = 2) -> RolloutBatch:
    """Rows r = i*G + j; prompt i has i+1 real tokens (value 10+i), completion row r has r+1 tokens (value 100+r)."""
    n, p, t = num_prompts * group, num_prompts, num_prompts * group
    prompt_ids = torch.full((n, p), PAD)
    prompt_mask = torch.zeros(n, p, dtype=torch.long)
    completion_ids = torch.full((n, t), PAD)
    completion_mask = torch.zeros(n, t)
    for r in range(n):
        i = r // group
        prompt_ids[r, p - (i + 1) :] = 10 + i
        prompt_mask[r, p - (i + 1) :] = 1
        completion_ids[r, : r + 1] = 100 + r
        completion_mask[r, : r + 1] = 1
    return RolloutBatch(
        prompt_ids=prompt_ids,
        prompt_mask=prompt_mask,
        completion_ids=completion_ids,
        completion_mask=completion_mask,
        sampler_logp=-completion_mask * torch.arange(1, n + 1)[:, None],  # row r: -(r+1) on real tokens
        truncated=torch.tensor([r == n - 1 for r in range(n)]),
        finish_reason=["length" if r == n - 1 else "stop" for r in range(n)],
        prompts=[f"p{r // group}" for r in range(n)],
        completions=[f"c{r}" for r in range(n)],
        group_size=group,
    )


def test_properties():
    b = make_batch(num_prompts=3, group=2)
    assert len(b) == 6 and b.num_prompts == 3
    assert b.completion_lengths.tolist() == [1, 2, 3, 4, 5, 6]
    # Row 1 (prompt 0, 1 real prompt token of 3; 2 completion tokens of 6):
    # input_ids = [0, 0, 10, 101, 101, 0, 0, 0, 0], attention_mask = [0, 0, 1, 1, 1, 0, 0, 0, 0]
    assert b.input_ids[1].tolist() == [0, 0, 10, 101, 101, 0, 0, 0, 0]
    assert b.attention_mask[1].tolist() == [0, 0, 1, 1, 1, 0, 0, 0, 0]
    assert b.attention_mask.dtype == torch.long and b.input_ids.shape == (6, 9)


def test_select_whole_groups_keeps_group_size_and_fields_consistent():
    b = make_batch(num_prompts=3, group=2)
    sub = b.select([4, 5, 0, 1])  # groups 2 then 0
    assert sub.group_size == 2 and sub.num_prompts == 2
    assert sub.completion_lengths.tolist() == [5, 6, 1, 2]
    assert sub.prompts == ["p2", "p2", "p0", "p0"] and sub.completions == ["c4", "c5", "c0", "c1"]
    assert sub.finish_reason == ["stop", "length", "stop", "stop"] and sub.truncated.tolist() == [
        False,
        True,
        False,
        False,
    ]
    assert sub.sampler_logp[:, 0].tolist() == [-5.0, -6.0, -1.0, -2.0]
    assert torch.equal(sub.prompt_ids, b.prompt_ids[[4, 5, 0, 1]])
    assert torch.equal(sub.input_ids, b.input_ids[[4, 5, 0, 1]])


def test_select_groups_and_bool_masks():
    b = make_batch(num_prompts=3, group=2)
    by_groups = b.select_groups([2, 0])
    assert by_groups.completions == ["c4", "c5", "c0", "c1"] and by_groups.group_size == 2
    masked = b.select_groups(torch.tensor([True, False, True]))
    assert masked.completions == ["c0", "c1", "c4", "c5"] and masked.group_size == 2
    rows = b.select(torch.tensor([False, True, False, False, True, False]))
    assert rows.completions == ["c1", "c4"]


def test_select_partial_groups_gives_group_size_one():
    b = make_batch(num_prompts=3, group=2)
    assert b.select([1, 2]).group_size == 1  # rows of two different groups
    assert b.select([1, 0]).group_size == 1  # a whole group, but out of order
    assert b.select([3]).group_size == 1


def test_select_rejects_out_of_range():
    b = make_batch()
    with pytest.raises(ValueError, match="row indices"):
        b.select([0, 6])
    with pytest.raises(ValueError, match="bool mask"):
        b.select(torch.tensor([True, False]))


def test_construction_checks_shapes_and_groups():
    b = make_batch(num_prompts=3, group=2)
    fields = {k: getattr(b, k) for k in b.__dataclass_fields__}
    with pytest.raises(ValueError, match="sampler_logp"):
        RolloutBatch(**{**fields, "sampler_logp": torch.zeros(6, 5)})
    with pytest.raises(ValueError, match="group_size"):
        RolloutBatch(**{**fields, "group_size": 4})
    with pytest.raises(ValueError, match="completions"):
        RolloutBatch(**{**fields, "completions": ["x"]})
    with pytest.raises(ValueError, match="finish_reason"):
        RolloutBatch(**{**fields, "finish_reason": ["eos"] * 6})


@pytest.mark.parametrize(
    "kwargs, match",
    [
        (dict(max_new_tokens=0), "max_new_tokens"),
        (dict(temperature=0.0), "greedy=True"),
        (dict(top_p=0.0), "top_p"),
        (dict(top_p=1.5), "top_p"),
        (dict(top_k=-1), "top_k"),
        (dict(stop_strings=("",)), "stop_strings"),
        (dict(stop_token_ids=(-1,)), "stop_token_ids"),
    ],
)
def test_sampling_params_validation(kwargs, match):
    with pytest.raises(ValueError, match=match):
        SamplingParams(**kwargs)


def test_sampling_params_normalisation():
    p = SamplingParams(stop_strings="\n\n", stop_token_ids=[5, 6], greedy=True, temperature=0.0)
    assert p.stop_strings == ("\n\n",) and p.stop_token_ids == (5, 6)
    assert p.logp_temperature == 1.0  # greedy at temperature 0 stores log-probs at temperature 1
    assert SamplingParams(temperature=0.7).logp_temperature == 0.7


def test_concat_batches_pads_prompts_left_and_completions_right():
    from lmrl.rollout.types import concat_batches

    a, b = make_batch(num_prompts=1, group=2), make_batch(num_prompts=2, group=2)  # widths P 1 vs 2, T 2 vs 4
    c = concat_batches([a, b], pad_id=PAD)
    assert len(c) == 6 and c.group_size == 2 and c.prompt_ids.shape == (6, 2) and c.completion_ids.shape == (6, 4)
    assert c.prompts == a.prompts + b.prompts and c.completions == a.completions + b.completions
    assert c.prompt_ids[0].tolist() == [PAD, 10] and c.prompt_mask[0].tolist() == [0, 1]  # left-padded
    assert c.completion_ids[1].tolist() == [101, 101, PAD, PAD] and c.completion_mask[1].tolist() == [1, 1, 0, 0]
    assert c.sampler_logp[1].tolist() == [-2, -2, 0, 0]
    assert (
        torch.equal(c.completion_ids[2:], b.completion_ids)
        and c.truncated.tolist() == [False, True] + b.truncated.tolist()
    )
    # the concatenated rows give the same sequences as each batch's own (pads masked)
    for row, (src, k) in enumerate([(a, 0), (a, 1), (b, 0), (b, 1), (b, 2), (b, 3)]):
        assert (
            c.input_ids[row][c.attention_mask[row].bool()].tolist()
            == src.input_ids[k][src.attention_mask[k].bool()].tolist()
        )
    assert concat_batches([a], PAD) is a
