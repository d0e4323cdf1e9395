"""Several processes (gloo, 2 CPU processes forked from the test) train exactly like one process on the same global
batch: after 3 steps of SFT, DPO (offline and online), distillation, self-play, GRPO and pretraining (and LoRA SFT) the final weights agree to 1e-5 (measured:
~1e-7, float rounding of summing two half-batch gradients instead of one full-batch gradient), FSDP2 and DDP."""

from __future__ import annotations

import shutil
import sys
from pathlib import Path

import pytest
import torch
from dist_helpers import GRPO_RUN, final_weights, max_weight_diff, run_ranks
from safetensors.torch import load_file

from lmrl.config import ConfigError, load_config
from lmrl.data.corpus import builtin_corpus
from lmrl.data.tokenizers import build_char_tokenizer
from lmrl.models import load_model, load_model_and_tokenizer
from lmrl.tracking import read_jsonl
from lmrl.trainers.distill import trainer as distill
from lmrl.trainers.dpo import trainer as preference
from lmrl.trainers.pretrain import trainer as pretrain
from lmrl.trainers.rejection import trainer as rejection
from lmrl.trainers.reward import trainer as reward
from lmrl.trainers.rl import trainer as online
from lmrl.trainers.selfplay import trainer as selfplay
from lmrl.trainers.sft import trainer as sft
from tests.helpers import TINY

sys.path.insert(0, str(Path(__file__).parents[1] / "trainers"))  # env=agentic_envs:digits
TOL = 1e-5


COMMON = [
    "precision=fp32",
    "max_steps=3",
    "eval_every=0",
    "save_every=0",
    "log_every=1",
    "check_contamination=false",
    "lr_schedule=constant",
    "warmup_steps=0",
    *TINY,
]
SELFPLAY = [
    "challenger_prompt=short",
    "rewards=[dist_helpers:digit_fraction]",
    "queries_per_step=8",
    "answers_per_query=2",
    "challenger_max_new_tokens=4",
    "solver_max_new_tokens=4",
    "sampling_shards=2",
    "lr=1e-3",
]
"""Self-play with each rank sampling its shard of the queries; a variant adds its own keys."""
RUNS = {
    "sft": (
        sft.SFTConfig,
        sft.train,
        [
            "dataset=task:arithmetic",
            "task_args.digits=1",
            "train_rows=64",
            "eval_rows=4",
            "batch_size=8",
            "grad_accum=2",
            "eval_max_new_tokens=4",
            "lr=1e-3",
        ],
    ),
    "dpo": (
        preference.DPOConfig,
        preference.train,
        [
            "data_args.digits=1",
            "train_rows=48",
            "eval_rows=8",
            "batch_size=8",
            "eval_max_new_tokens=4",
            "eval_samples=2",
            "lr=1e-3",
        ],
    ),
    # min_gap makes ties: an odd number of kept pairs leaves the ranks with different counts (pads, weight 0)
    "online_dpo": (
        preference.DPOConfig,
        preference.train,
        [
            "online=true",
            "rewards=[gold]",
            "min_gap=1.3",
            "data_args.digits=1",
            "train_rows=48",
            "eval_rows=4",
            "batch_size=4",
            "grad_accum=2",
            "samples_per_prompt=4",
            "max_new_tokens=6",
            "sampling_shards=2",
            "eval_max_new_tokens=4",
            "eval_samples=1",
            "lr=1e-3",
        ],
    ),
    "distill": (
        distill.DistillConfig,
        distill.train,
        [
            "task_args.digits=1",
            "train_rows=64",
            "eval_rows=4",
            "batch_size=8",
            "grad_accum=2",
            "on_policy_frac=0.5",
            "max_new_tokens=6",
            "sampling_shards=2",
            "eval_max_new_tokens=4",
            "lr=1e-3",
        ],
    ),
    # LSP-Zero, any non-empty query valid; an empty one leaves its rank fewer Solver rows (masked pads)
    "selfplay": (
        selfplay.SelfPlayConfig,
        selfplay.train,
        ["variant=lsp_zero", *SELFPLAY],
    ),
    # LSP: the reference model's self-reward judge generates on each rank with the reference unsharded (a random
    # tiny judge writes no parseable score: R_Q is the fallback; the test is that the judge runs, no hang, same weights)
    "selfplay_lsp": (
        selfplay.SelfPlayConfig,
        selfplay.train,
        ["variant=lsp", "judge_max_new_tokens=8", *SELFPLAY],
    ),
    "grpo": (
        online.RLConfig,
        online.train,
        [
            *GRPO_RUN,
            "max_new_tokens=6",
            "sampling_shards=2",
            "lr=1e-3",
            "kl_coef=0.05",
        ],
    ),
    "reward": (
        reward.RewardConfig,
        reward.train,
        [
            "dataset=builtin:prefs",
            "data_args.digits=1",
            "train_rows=48",
            "eval_rows=8",
            "batch_size=8",
            "grad_accum=2",
            "lr=1e-3",
        ],
    ),
    "pretrain": (
        pretrain.PretrainConfig,
        pretrain.train,
        [
            "block_size=32",
            "batch_size=8",
            "grad_accum=2",
            "eval_batches=2",
            "num_samples=1",
            "sample_tokens=4",
            "lr=1e-3",
        ],
    ),
}
GLOBAL_METRICS = {
    "online_dpo": ("label/pairs", "label/gap", "policy/reward_margin", "policy/reward_accuracy"),
    "selfplay": ("challenger/reward_mean", "challenger/pass_rate", "challenger/loss", "solver/kl"),
    "distill": ("loss/kl_forward", "loss/kl_reverse", "rollout/on_policy_rows", "completion_len/mean"),
}


def run(tmp_path, method, name, *overrides):
    cls, train, args = RUNS[method]
    if method == "pretrain":
        corpus = tmp_path / "corpus.txt"
        corpus.write_text(builtin_corpus()[:20_000])
        args = [*args, f"data={corpus}"]
    if method == "distill":  # a teacher that differs from the student: the same tiny architecture, another seed
        teacher = tmp_path / "teacher"
        tokenizer = build_char_tokenizer()
        model_args = {k.split("=")[0].removeprefix("model_args."): int(k.split("=")[1]) for k in TINY}
        load_model("builtin:tiny", tokenizer, seed=7, model_args=model_args).save_pretrained(teacher)
        tokenizer.save_pretrained(teacher)
        args = [*args, f"teacher={teacher}"]
    config = load_config(cls, None, [f"output_dir={tmp_path / name}", *COMMON, *args, *overrides])
    return config, train


@pytest.mark.parametrize(
    "method,parallel",
    [
        ("sft", "fsdp"),
        ("dpo", "ddp"),
        ("grpo", "fsdp"),
        ("sft", "ddp"),
        pytest.param("dpo", "fsdp", marks=pytest.mark.slow),  # the other backend runs by default
        ("grpo", "ddp"),
        ("pretrain", "fsdp"),
        ("reward", "fsdp"),
        pytest.param("reward", "ddp", marks=pytest.mark.slow),  # the other backend runs by default
        pytest.param("online_dpo", "fsdp", marks=pytest.mark.slow),  # the other backend runs by default
        ("online_dpo", "ddp"),
        pytest.param("distill", "fsdp", marks=pytest.mark.slow),  # the other backend runs by default
        ("distill", "ddp"),
        pytest.param("selfplay", "fsdp", marks=pytest.mark.slow),  # the other backend runs by default
        ("selfplay", "ddp"),
        pytest.param("selfplay_lsp", "fsdp", marks=pytest.mark.slow),
    ],
)
def test_two_processes_train_like_one_on_the_same_global_batch(tmp_path, method, parallel):
    two_like_one(tmp_path, method, parallel)


def test_packed_sft_on_two_processes_trains_like_one(tmp_path):
    # 26-27-token rows into 80-token bins: 3 bins for 8 rows, so one rank runs a zero-weight repeat (same backwards)
    two_like_one(tmp_path, "sft", "ddp", "grad_accum=1", "max_length=64", "max_tokens_per_microbatch=80")


@pytest.mark.slow
@pytest.mark.parametrize("method", ["dpo", "reward"])
def test_packed_preferences_on_two_processes_train_like_one(tmp_path, method):
    two_like_one(tmp_path, method, "fsdp", "grad_accum=1", "max_length=64", "max_tokens_per_microbatch=150")


@pytest.mark.parametrize("method", ["grpo", "sft"])
def test_the_chunked_lm_head_runs_under_fsdp_and_trains_like_one_process(tmp_path, method):
    # a tiny chunk: every log-prob goes through the chunked head, on 1 process and on 2 FSDP ranks
    two_like_one(tmp_path, method, "fsdp", "logprob_chunk_mb=0.001")
    if method == "grpo":  # measured by the training forwards, not the setting
        records = read_jsonl(tmp_path / "two" / "metrics.jsonl")
        assert [r["update/chunked_head"] for r in records if "update/chunked_head" in r] == [1.0] * 3


@pytest.mark.slow
def test_packed_rl_on_two_processes_trains_like_one(tmp_path):
    two_like_one(tmp_path, "grpo", "ddp", "max_tokens_per_microbatch=50", "skip_zero_advantage=false")


DROPS = ["algorithm=dapo", "rewards=[dist_helpers:has_digit]"]  # steps 1-2 drop 1 of 4 groups: one rank's


@pytest.mark.parametrize(
    "overrides",
    [
        ["algorithm=reinforce"],
        pytest.param(["adv_scale=batch"], marks=pytest.mark.slow),  # the same batch-wide statistics as reinforce's
        DROPS,
        pytest.param([*DROPS, "loss_agg=seq_mean"], marks=pytest.mark.slow),
    ],
)
def test_rl_batch_statistics_are_over_every_rank(tmp_path, overrides):
    """REINFORCE's batch-mean baseline and GRPO's adv_scale=batch use every rank's rewards; DAPO's dropped groups
    leave the ranks with different numbers of trained rows (token and row means over every rank's)."""
    two_like_one(tmp_path, "grpo", "fsdp", *overrides)


PPO = ["algorithm=ppo", "ppo_epochs=2", "value_clip=0.01"]  # epoch 2 clips some values (vf_clip_frac > 0)


@pytest.mark.parametrize("parallel", ["fsdp", pytest.param("ddp", marks=pytest.mark.slow)])
def test_ppo_value_model_trains_like_one_process_and_resumes(tmp_path, parallel):
    """PPO with a KL reference: the value model is sharded (replicated) like the policy, GAE runs on each rank's
    sequences, the whitening and the value loss use every rank's tokens and rows; a resume from the step-2 DCP
    checkpoint (policy and value model) ends where the uninterrupted run did."""
    two_like_one(tmp_path, "grpo", parallel, *PPO, "save_every=2")
    one, two = (read_jsonl(tmp_path / name / "metrics.jsonl") for name in ("one", "two"))
    steps = [(a, b) for a, b in zip(one, two) if "value/mean" in a]
    assert len(steps) == 3 and any(a["value/clip_frac"] > 0 for a, _ in steps)
    for a, b in steps:  # over every rank's tokens: with per-rank whitening the weights differ by 9e-4 (measured)
        for key in ("loss/value", "value/mean", "value/returns_mean", "value/clip_frac", "policy/clip_frac"):
            assert a[key] == pytest.approx(b[key], rel=1e-4, abs=1e-6), key
    resumed = tmp_path / "resumed"
    shutil.copytree(tmp_path / "two", resumed)
    shutil.rmtree(resumed / "final")
    shutil.rmtree(resumed / "checkpoints" / "step-3")
    config, train = run(tmp_path, "grpo", "resumed", *PPO, "save_every=2", f"parallel={parallel}", "resume=true")
    run_ranks(train, config)
    diff = max_weight_diff(tmp_path / "two", resumed)
    print(f"resumed: max |w_two - w_resumed| = {diff:.2e}")
    assert diff < 1e-6
    last = [m for m in read_jsonl(resumed / "metrics.jsonl") if m["step"] == 3 and "value/mean" in m][-1]
    assert last["value/mean"] == pytest.approx(steps[-1][1]["value/mean"], rel=1e-5)  # the value model resumed


MULTI_TURN = ["env=agentic_envs:digits", "rewards=[env]", "max_turns=3", "max_total_tokens=40"]


@pytest.mark.slow
def test_multi_turn_episodes_train_like_one_process(tmp_path):
    """Environment episodes (two turns with user feedback between): each rank runs the episodes of its shards with
    the policy unsharded, so episodes of different lengths need no lockstep; every rank has the same rows."""
    two_like_one(tmp_path, "grpo", "fsdp", *MULTI_TURN)
    one, two = (read_jsonl(tmp_path / name / "metrics.jsonl") for name in ("one", "two"))
    steps = [(a, b) for a, b in zip(one, two) if "rollout/turns_mean" in a]
    assert len(steps) == 3 and max(a["rollout/turns_mean"] for a, _ in steps) > 1
    for a, b in steps:
        for key in ("reward/mean", "rollout/turns_mean", "completion_len/mean", "rollout/trained_tokens_frac"):
            assert a[key] == pytest.approx(b[key], rel=1e-5), key


def two_like_one(tmp_path, method, parallel, *overrides):
    config, train = run(tmp_path, method, "one", *overrides)
    train(config)
    config, train = run(tmp_path, method, "two", f"parallel={parallel}", *overrides)
    run_ranks(train, config)
    diff = max_weight_diff(tmp_path / "one", tmp_path / "two")
    print(f"max |w_one - w_two| = {diff:.2e}")
    model, _ = load_model_and_tokenizer(config.model, config.tokenizer, config.seed, dict(config.model_args))
    start = {k: v for k, v in model.state_dict().items() if k != "lm_head.weight"}
    if method == "reward":
        # AdamW divides by sqrt(v), so the rounding of near-zero gradient entries (a rarely seen token's embedding,
        # key projections under a loss of reward differences) becomes steps of up to lr = 1e-3 in single entries:
        # measured 2.1e-5 on an AMD EPYC, 8.2e-4 (one embedding row) on a Xeon with AMX, whose fp32 kernels round
        # otherwise at each batch size. A wrong reduction moves every weight: compare whole updates instead.
        one, two = final_weights(tmp_path / "one"), final_weights(tmp_path / "two")
        apart = sum(((one[k] - two[k]) ** 2).sum() for k in one).sqrt()
        update = sum(((one[k] - start[k]) ** 2).sum() for k in one).sqrt()
        print(f"|w_one - w_two| / |w_one - w_start| = {apart / update:.2e}")
        assert apart < 1e-2 * update
    else:
        assert diff < TOL
    if method == "reward":  # the reward head, saved beside the backbone
        heads = [load_file(tmp_path / run_name / "final" / "reward_head.safetensors") for run_name in ("one", "two")]
        assert heads[0].keys() == heads[1].keys() == {"score.weight", "score.bias"}
        assert (heads[0]["score.weight"] - heads[1]["score.weight"]).abs().max() < TOL  # measured 3e-8
        # Bradley-Terry's loss depends on reward differences only: the bias's gradient is 0 up to rounding, which
        # AdamW turns into steps of up to lr in either direction, differently in each run (measured |b| <= 2.4e-4)
        assert all(head["score.bias"].abs().max() <= 3 * 1e-3 for head in heads)
    trained = final_weights(tmp_path / "one")
    assert max((trained[k] - start[k]).abs().max().item() for k in start) > 100 * TOL  # the equality is not vacuous
    one, two = read_jsonl(tmp_path / "one" / "metrics.jsonl"), read_jsonl(tmp_path / "two" / "metrics.jsonl")
    assert [m["step"] for m in one] == [m["step"] for m in two]  # rank 0 alone logged, once per step
    first = next(m for m in one if m["step"] == 1), next(m for m in two if m["step"] == 1)
    assert first[0]["loss"] == pytest.approx(first[1]["loss"], rel=1e-5, abs=1e-6)  # reduced over ranks
    # the global gradient before any update: Adam's first steps are ~lr*sign(g), blind to a wrongly scaled gradient
    assert first[0]["optim/grad_norm"] == pytest.approx(first[1]["optim/grad_norm"], rel=1e-4)
    if method == "online_dpo":  # an odd number of pairs: the ranks had different counts
        assert any(m["label/pairs"] % 2 for m in one if "label/pairs" in m)
    if method == "selfplay":  # an odd number of the 8 queries malformed: the ranks had different Solver rows
        assert any(round(m["challenger/malformed_frac"] * 8) % 2 for m in one if "challenger/malformed_frac" in m)
    assert all(any(key in m for m in one) for key in GLOBAL_METRICS.get(method, ()))
    for a, b in zip(one, two):  # counts and means over every rank's rows, not one rank's
        for key in GLOBAL_METRICS.get(method, ()):
            if key in a:
                assert a[key] == pytest.approx(b[key], rel=1e-4, abs=1e-6), key


def test_lora_with_ddp_trains_like_one_process_and_saves_the_merged_model(tmp_path):
    lora = ["lora_r=4", "merge_lora=true"]
    torch.manual_seed(0)  # the adapters' init draws from the global RNG at set-up: the same state for both runs
    config, train = run(tmp_path, "sft", "one", *lora)
    train(config)
    torch.manual_seed(0)  # the forked ranks inherit it
    config, train = run(tmp_path, "sft", "two", *lora, "parallel=ddp")
    run_ranks(train, config)
    assert max_weight_diff(tmp_path / "one", tmp_path / "two") < TOL  # measured 2.2e-7
    assert (tmp_path / "two" / "final" / "adapter" / "adapter_model.safetensors").exists()


@pytest.mark.parametrize(
    "overrides,message",
    [
        (["nproc=3", "batch_size=8"], "batch_size=8 does not split over 3 processes"),
        (["nproc=2", "batch_size=8", "grad_accum=3"], "multiple of 6"),
    ],
)
def test_a_world_size_that_does_not_divide_the_batch_fails_at_start_up(tmp_path, overrides, message):
    with pytest.raises(ConfigError, match=message):
        load_config(sft.SFTConfig, None, [f"output_dir={tmp_path}", *overrides])


def test_rl_refuses_what_needs_the_whole_batch_on_one_rank(tmp_path):
    with pytest.raises(ConfigError, match="prompts_per_step=6 does not split over 4"):
        load_config(online.RLConfig, None, [f"output_dir={tmp_path}", "nproc=4", "prompts_per_step=6"])
    with pytest.raises(ConfigError, match="curriculum .*Fix: nproc=1"):
        load_config(online.RLConfig, None, [f"output_dir={tmp_path}", "nproc=2", "curriculum=[0.1,0.9]"])
    with pytest.raises(ConfigError, match="sampling_shards=3"):
        load_config(online.RLConfig, None, [f"output_dir={tmp_path}", "nproc=2", "sampling_shards=3"])


def test_sampling_shards_make_samples_independent_of_the_process_count(tmp_path):
    """One process with sampling_shards=2 draws shard k with the generator rank k of two processes uses."""
    config, _ = run(tmp_path, "grpo", "x")
    assert config.sampling_shards == 2 and torch.distributed.is_available()


def test_rejection_sampling_on_two_processes_selects_and_trains_like_one(tmp_path):
    """Each rank samples and scores half the prompts; the gathered pool gives the same selection, and each round's
    SFT is data-parallel: 2 rounds end at the one-process weights."""
    args = [
        "precision=fp32",
        *TINY,
        "task_args.digits=1",
        "rewards=[dist_helpers:digit_fraction]",
        "train_rows=16",
        "eval_rows=4",
        "eval_samples=2",
        "samples_per_prompt=4",
        "max_new_tokens=6",
        "max_steps=3",
        "batch_size=8",
        "lr=1e-3",
        "warmup_steps=0",
        "rounds=2",
        "save_every=0",
        "sampling_shards=2",
        "check_contamination=false",
    ]
    for name in ("one", "two"):
        config = load_config(rejection.RejectionConfig, None, [f"output_dir={tmp_path / name}", *args])
        rejection.train(config) if name == "one" else run_ranks(rejection.train, config, timeout=120)
    for r in (1, 2):
        one, two = (read_jsonl(tmp_path / name / f"round-{r}" / "selection.jsonl") for name in ("one", "two"))
        assert [(x["prompt"], x["completion"]) for x in one] == [(x["prompt"], x["completion"]) for x in two]
    diff = max_weight_diff(tmp_path / "one", tmp_path / "two")
    print(f"max |w_one - w_two| = {diff:.2e}")
    assert diff < TOL
    one, two = (read_jsonl(tmp_path / name / "metrics.jsonl") for name in ("one", "two"))
    assert [m["step"] for m in one] == [m["step"] for m in two]  # rank 0 alone logged
    compared = [
        (a[key], b[key])
        for a, b in zip(one, two)
        for key in ("rs/reward_all", "rs/reward_selected", "rs/selected", "eval/reward")
        if key in a
    ]
    assert len(compared) == 3 * 2 + 3  # rs/* of rounds 1-2, eval/reward of steps 0-2
    assert all(a == pytest.approx(b, rel=1e-5) for a, b in compared), compared


def test_methods_without_a_data_parallel_step_refuse_several_processes(tmp_path, monkeypatch):
    from types import SimpleNamespace

    from lmrl.parallel import runtime
    from lmrl.swarm.cli import JoinedNode
    from lmrl.trainers import loop

    monkeypatch.setattr(runtime, "world", lambda: 2)
    config = load_config(sft.SFTConfig, None, [f"output_dir={tmp_path}"])
    run_ = SimpleNamespace(tracker=runtime.NullTracker(), checkpoint=None)
    with pytest.raises(ValueError, match="JoinedNode does not run on several processes yet.*self-play.*Fix: nproc=1"):
        loop.run(config, object.__new__(JoinedNode), run_)
    with pytest.raises(ConfigError, match="warm start runs in one process"):
        load_config(
            selfplay.SelfPlayConfig, None, [f"output_dir={tmp_path}", "nproc=2", "rewards=[x:y]", "warm_start_steps=10"]
        )
    # rejection sampling shards its prompts: they must split evenly
    with pytest.raises(ConfigError, match="divide train_rows=15"):
        load_config(rejection.RejectionConfig, None, [f"output_dir={tmp_path}", "nproc=2", "train_rows=15"])


def test_more_processes_than_cores_and_a_stale_world_size_are_refused_at_start_up(tmp_path, monkeypatch):
    import os

    from lmrl.trainers.sft import trainer as sft

    monkeypatch.setattr(os, "cpu_count", lambda: 2)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 0)
    with pytest.raises(ConfigError, match=r"nproc=4 starts 4 training processes, but this machine has 2 CPU cores"):
        load_config(sft.SFTConfig, None, [f"output_dir={tmp_path}", "nproc=4", "batch_size=8"])
    monkeypatch.setenv("WORLD_SIZE", "2")
    monkeypatch.delenv("MASTER_ADDR", raising=False)
    with pytest.raises(ConfigError, match="WORLD_SIZE=2 is set in the environment.*unset WORLD_SIZE"):
        load_config(sft.SFTConfig, None, [f"output_dir={tmp_path}", "batch_size=8"])
