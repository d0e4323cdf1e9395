"""Pretraining (ce | avatarl): it learns, accumulation and resume are exact, bad input is refused at start-up."""

import dataclasses
import json
import math
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch
from transformers import LlamaForCausalLM

from lmrl.algorithms import AvatarlOptions
from lmrl.config import ConfigError, load_config
from lmrl.data.corpus import builtin_corpus
from lmrl.data.tokenizers import build_char_tokenizer
from lmrl.models import load_model
from lmrl.models.loading import builtin_config
from lmrl.tracking import read_jsonl
from lmrl.trainers import common, lm_windows
from lmrl.trainers.pretrain import trainer as pretrain
from lmrl.trainers.pretrain.trainer import PretrainConfig
from tests.helpers import TINY, TINY_ARGS

VOCAB = 102  # builtin:char: 5 special tokens + "\n", "\t" + 95 printable ASCII characters


pytestmark = pytest.mark.usefixtures("one_thread")  # tests/conftest.py


@pytest.fixture(scope="module")
def corpus(tmp_path_factory):
    path = tmp_path_factory.mktemp("data") / "pydoc_head.txt"
    path.write_text(builtin_corpus()[:30_000])
    return path


def make_config(out, corpus, *overrides):
    base = [
        f"output_dir={out}",
        f"data={corpus}",
        "precision=fp32",
        *TINY,
        "block_size=32",
        "batch_size=16",
        "lr=1e-2",
        "warmup_steps=5",
        "eval_batches=4",
        "num_samples=1",
        "sample_tokens=8",
        "save_every=0",
        "log_every=5",
    ]
    return load_config(PretrainConfig, None, [*base, *overrides])


@pytest.fixture(scope="module")
def critic_dir(tmp_path_factory, corpus):
    """A tiny critic made the documented way: `lmrl pretrain objective=ce`, then its final/ directory."""
    torch.set_num_threads(1)
    out = tmp_path_factory.mktemp("critic") / "run"
    result = pretrain.train(make_config(out, corpus, "objective=ce", "max_steps=60", "eval_every=0", "seed=7"))
    assert result["eval/ce"] < result["initial/eval/ce"] - 1.0, result
    return out / "final"


# --------------------------------------------------------------------------- config


def test_config_exposes_every_avatarl_option_with_its_default():
    fields = {f.name: f for f in dataclasses.fields(PretrainConfig)}
    options = [f for f in dataclasses.fields(AvatarlOptions) if f.name != "ignore_index"]
    for option in options:
        assert option.name in fields, option.name
        assert fields[option.name].default == option.default, option.name
        assert fields[option.name].metadata["help"], option.name
    assert PretrainConfig().avatarl_options() == AvatarlOptions()
    cfg = load_config(
        PretrainConfig,
        None,
        [
            "objective=avatarl",
            "critic=x",
            "top_k=4",
            "threshold=mean",
            "entropy_mode=temperature",
            "reward_clamp=null",
            "critic_topk=false",
        ],
    )
    assert cfg.avatarl_options() == AvatarlOptions(
        top_k=4, threshold="mean", entropy_mode="temperature", reward_clamp=None, critic_topk=False
    )


@pytest.mark.parametrize(
    "overrides, message",
    [
        (["objective=avatarl"], "needs a critic"),
        (["critic=runs/x/final"], "only used by objective=avatarl"),
        (["batch_size=10", "grad_accum=3"], "divisible by grad_accum"),
        (["objective=avatarl", "critic=x", "epsilon=1.0"], "epsilon=1.0"),
        (["objective=avatarl", "critic=x", "threshold=median"], "threshold"),
        (["val_fraction=0"], "val_fraction"),
        (["eval_batches=0"], "eval_batches"),
    ],
)
def test_bad_config_refused(overrides, message):
    with pytest.raises(ConfigError, match=message):
        load_config(PretrainConfig, None, overrides)


# --------------------------------------------------------------------------- data and metric


def test_windows_are_packed_from_the_line_aligned_split(tmp_path):
    # "ab\n" x 10 = 30 chars; val_fraction 0.2 -> cut at int(30 * 0.8) = 24, already a line start
    # ("\n" at index 23) -> train = 24 chars, val = 6 chars. One char = one token (builtin:char).
    # block 5, stride 5: train (24 - 1) // 5 = 4 windows of 6 tokens starting at 0, 5, 10, 15;
    # val (6 - 1) // 5 = 1 window.
    path = tmp_path / "ab.txt"
    path.write_text("ab\n" * 10)
    cfg = load_config(PretrainConfig, None, [f"data={path}", "val_fraction=0.2", "block_size=5"])
    tokenizer = build_char_tokenizer()
    windows = lm_windows.load_windows(cfg, tokenizer)
    assert windows.train.shape == (4, 6) and windows.val.shape == (1, 6)
    assert tokenizer.decode(windows.train[0]) == "ab\nab\n"
    assert tokenizer.decode(windows.train[1]) == "\nab\nab"  # chars 5..10
    assert tokenizer.decode(windows.val[0]) == "ab\nab\n"
    assert "0.00% unknown" in windows.summary


def test_too_little_text_is_refused(tmp_path):
    path = tmp_path / "short.txt"
    path.write_text("ab\n" * 10)
    cfg = load_config(PretrainConfig, None, [f"data={path}", "val_fraction=0.2", "block_size=8"])
    with pytest.raises(ValueError, match=r"validation text .* 6 tokens, too few .* block_size \+ 1 = 9"):
        lm_windows.load_windows(cfg, build_char_tokenizer())


class ConstantLogits(torch.nn.Module):
    """A fake LM whose next-token logits are the same vector at every position."""

    def __init__(self, logits):
        super().__init__()
        self.logits = torch.tensor(logits)

    def forward(self, input_ids):
        return SimpleNamespace(logits=self.logits.expand(*input_ids.shape, -1))


@pytest.mark.parametrize("batch_size", [1, 2, 5])
def test_validation_stats_by_hand(batch_size):
    # logits [ln 2, 0, 0] -> p = [1/2, 1/4, 1/4]; windows [0,0,1,2] and [2,1,1,0] have targets
    # [0,1,2] and [1,1,0]: -ln p = [ln2, ln4, ln4] and [ln4, ln4, ln2] -> total 2·(ln2 + 2 ln4) = 10 ln2
    # over 6 targets: CE = 10 ln2 / 6 = 1.155245 nats, whatever the batching.
    # Entropy at every position: 1/2·ln2 + 2·1/4·ln4 = 1.5 ln2 = 1.039721 nats.
    model = ConstantLogits([math.log(2.0), 0.0, 0.0])
    windows = torch.tensor([[0, 0, 1, 2], [2, 1, 1, 0]])
    stats = lm_windows.validation_stats(model, windows, batch_size, None)
    assert stats["eval/ce"] == pytest.approx(10 * math.log(2) / 6, abs=1e-6)
    assert stats["eval/entropy"] == pytest.approx(1.5 * math.log(2), abs=1e-6)
    uniform = ConstantLogits([0.0] * VOCAB)  # -ln(1/102) = 4.624973 at every target, and H = ln 102
    stats = lm_windows.validation_stats(uniform, torch.randint(0, VOCAB, (3, 9)), 2, None)
    assert stats["eval/ce"] == pytest.approx(4.624973, abs=1e-6) and stats["eval/entropy"] == pytest.approx(
        4.624973, abs=1e-6
    )


def test_expected_reward_by_hand():
    # Position 1: logits [0, 0, ln 2] -> π = [1/4, 1/4, 1/2]; A = [2, 0, (repeat of 2)], r = [1.5, 0.5, 0]
    #   -> Σ π(a) r(a) = 1/2·1.5 + 1/4·0.5 = 0.875.
    # Position 2: logits [ln 3, 0, 0] -> π = [3/5, 1/5, 1/5]; A = [1, 0, 2], r = [1.5, 1.0, 0]
    #   -> 1/5·1.5 + 3/5·1.0 = 0.9.  Mean over the 2 positions: 0.8875, for every chunk size.
    logits = torch.tensor([[[0.0, 0.0, math.log(2.0)], [math.log(3.0), 0.0, 0.0]]])  # (1, 2, 3)
    actions = torch.tensor([[[2, 0, 2], [1, 0, 2]]])
    rewards = torch.tensor([[[1.5, 0.5, 0.0], [1.5, 1.0, 0.0]]])
    for chunk in (None, 1, 5):
        assert pretrain.expected_reward(logits, actions, rewards, chunk) == pytest.approx(0.8875, abs=1e-6)


# --------------------------------------------------------------------------- one step


def grads(model):
    return {n: p.grad.detach().clone() for n, p in model.named_parameters() if p.grad is not None}


@pytest.mark.parametrize("objective", ["ce", "avatarl"])
def test_gradient_accumulation_is_exact(objective):
    tokenizer = build_char_tokenizer()
    model = load_model("builtin:tiny", tokenizer, seed=0, model_args=TINY_ARGS)
    critic = load_model("builtin:tiny", tokenizer, seed=1, model_args=TINY_ARGS).requires_grad_(False)
    critic = critic if objective == "avatarl" else None
    windows = torch.randint(5, VOCAB, (8, 17), generator=torch.Generator().manual_seed(0))
    options = AvatarlOptions(top_k=4)
    full = pretrain.train_step(model, critic, windows, objective, options, 1, None, step=1)
    g_full = grads(model)
    model.zero_grad(set_to_none=True)
    accum = pretrain.train_step(model, critic, windows, objective, options, 4, None, step=1)
    g_accum = grads(model)
    assert set(g_full) == {n for n, _ in model.named_parameters()}  # every parameter gets a gradient
    assert accum["loss"] == pytest.approx(full["loss"], rel=1e-5)
    for name in g_full:
        torch.testing.assert_close(g_accum[name], g_full[name], rtol=1e-4, atol=1e-7)
    with torch.no_grad():
        logits = model(input_ids=windows[:, :-1]).logits
    ce = torch.nn.functional.cross_entropy(logits.flatten(0, 1), windows[:, 1:].flatten()).item()
    assert full["loss/ce"] == pytest.approx(ce, rel=1e-5)
    if objective == "ce":
        assert full["loss"] == pytest.approx(ce, rel=1e-5)
    else:
        assert full["avatarl/gold_reward"] == pytest.approx(1.5, abs=1e-5)  # the clamp always binds (spec §1.2.7)
        assert 1 <= full["avatarl/active_size"] <= 2 * 4 + 1


# --------------------------------------------------------------------------- whole runs


def test_short_avatarl_run_lowers_validation_ce(tmp_path, corpus, critic_dir):
    cfg = make_config(
        tmp_path / "run",
        corpus,
        "objective=avatarl",
        f"critic={critic_dir}",
        "max_steps=40",
        "eval_every=20",
        "top_k=8",
    )
    result = pretrain.train(cfg)
    # random init: about ln(102) = 4.62 nats; 40 avatarl steps must take off well over 1 nat.
    assert result["initial/eval/ce"] == pytest.approx(math.log(VOCAB), abs=0.1)
    assert result["eval/ce"] < result["initial/eval/ce"] - 1.0, result
    assert result["eval/ppl"] == pytest.approx(math.exp(result["eval/ce"]), rel=1e-9)
    assert result["initial/eval/critic_ce"] < result["initial/eval/ce"] - 1.0  # the critic is a trained model
    records = read_jsonl(cfg.output_dir + "/metrics.jsonl")
    evals = [r for r in records if "eval/ce" in r]
    assert [r["step"] for r in evals] == [0, 20, 40]
    assert all(0 < r["eval/entropy"] <= math.log(VOCAB) + 1e-6 for r in evals)
    train_logs = [r for r in records if "loss" in r]
    assert [r["step"] for r in train_logs] == [1, *range(5, 41, 5)]  # the first step, then every log_every
    for key in (
        "avatarl/gold_reward",
        "avatarl/reward_mean",
        "avatarl/expected_reward",
        "avatarl/rewarded_per_position",
        "avatarl/active_size",
        "loss/ce",
        "lr",
        "tokens_per_s",
        "optim/grad_norm",
    ):
        assert all(key in r for r in train_logs), key
    assert train_logs[-1]["time/tokens"] == 40 * 16 * 32
    assert train_logs[-1]["avatarl/rewarded_per_position"] > 1.0  # the "dense" reward: > gold alone
    # the return REINFORCE ascends grows: from about 1.5/|V|·(rewarded tokens) at random init
    assert train_logs[-1]["avatarl/expected_reward"] > 2 * train_logs[0]["avatarl/expected_reward"]
    run = Path(cfg.output_dir)
    for name in ("config.yaml", "samples.jsonl", "final/config.json", "final/tokenizer.json", "plots/loss.png"):
        assert (run / name).exists(), name
    sample = json.loads((run / "samples.jsonl").read_text().splitlines()[-1])
    assert sample["step"] == 40 and len(sample["prompt"]) == 16 and len(sample["continuation"]) == 8


def test_resume_after_crash_matches_uninterrupted_run(tmp_path, corpus, critic_dir, monkeypatch):
    args = [
        "objective=avatarl",
        f"critic={critic_dir}",
        "max_steps=10",
        "save_every=3",
        "eval_every=3",
        "log_every=1",
        "keep_checkpoints=5",
        "top_k=4",
    ]
    pretrain.train(make_config(tmp_path / "full", corpus, *args))

    real = pretrain.train_step

    def crashing(*a, step, **kw):
        if step == 8:
            raise RuntimeError("simulated crash")
        return real(*a, step=step, **kw)

    monkeypatch.setattr(pretrain, "train_step", crashing)
    with pytest.raises(RuntimeError, match="simulated crash"):
        pretrain.train(make_config(tmp_path / "killed", corpus, *args))
    assert common.checkpoint_step(common.latest_checkpoint(tmp_path / "killed")) == 6
    monkeypatch.setattr(pretrain, "train_step", real)
    pretrain.train(make_config(tmp_path / "killed", corpus, *args, "resume=true"))

    full = read_jsonl(tmp_path / "full" / "metrics.jsonl")
    resumed = read_jsonl(tmp_path / "killed" / "metrics.jsonl")
    assert [r["step"] for r in resumed] == [r["step"] for r in full]
    for a, b in zip(full, resumed):
        for key in {k for k in a if not k.startswith("memory/")} - {"time_s", "tokens_per_s", "time/train_s"}:
            assert b[key] == pytest.approx(a[key], rel=1e-6, abs=1e-9), (a["step"], key)


def test_hf_config_from_scratch_and_jsonl_text(tmp_path):
    from transformers import GPT2Config

    GPT2Config(vocab_size=VOCAB, n_embd=32, n_layer=1, n_head=2, n_positions=64).save_pretrained(tmp_path / "gpt2")
    data = tmp_path / "d.jsonl"
    data.write_text(
        "".join(json.dumps({"text": builtin_corpus()[i : i + 2000]}) + "\n" for i in range(0, 10_000, 2000))
    )
    cfg = load_config(
        PretrainConfig,
        None,
        [
            f"model={tmp_path / 'gpt2'}",
            "from_scratch=true",
            "tokenizer=builtin:char",
            f"data={data}",
            f"output_dir={tmp_path / 'run'}",
            "block_size=32",
            "batch_size=8",
            "max_steps=3",
            "precision=fp32",
            "num_samples=0",
            "model_args.n_layer=2",
        ],
    )
    result = pretrain.train(cfg)
    assert result["initial/eval/ce"] == pytest.approx(math.log(VOCAB), abs=0.1)  # random init, not loaded weights
    assert json.loads((tmp_path / "run" / "final" / "config.json").read_text())["n_layer"] == 2  # model_args applied
    typo = dataclasses.replace(cfg, model_args={"n_layers": 2}, output_dir=str(tmp_path / "typo"))
    with pytest.raises(ValueError, match=r"model_args \['n_layers'\] are not fields of .*GPT2Config"):
        pretrain.train(typo)


# --------------------------------------------------------------------------- refused at start-up


@pytest.fixture
def no_training(monkeypatch):
    def fail(*args, **kwargs):
        raise AssertionError("a training step ran before the bad input was refused")

    monkeypatch.setattr(pretrain, "train_step", fail)


def test_critic_with_other_vocabulary_size_refused(tmp_path, corpus, no_training):
    tokenizer = build_char_tokenizer()
    config = builtin_config("builtin:tiny", 120, tokenizer.pad_token_id, tokenizer.eos_token_id, **TINY_ARGS)
    critic = LlamaForCausalLM(config)  # 120 logits per position, the student has 102
    critic.save_pretrained(tmp_path / "critic")
    cfg = make_config(tmp_path / "run", corpus, "objective=avatarl", f"critic={tmp_path / 'critic'}")
    with pytest.raises(ValueError, match=r"vocabulary of 120 tokens but the student has 102"):
        pretrain.train(cfg)
    assert not (tmp_path / "run").exists()  # refused before the run directory was created


def test_critic_with_other_tokenizer_refused(tmp_path, corpus, no_training):
    critic = load_model("builtin:tiny", build_char_tokenizer(), model_args=TINY_ARGS)
    critic.save_pretrained(tmp_path / "critic")
    build_char_tokenizer().save_pretrained(tmp_path / "critic")
    spec = json.loads((tmp_path / "critic" / "tokenizer.json").read_text())
    vocab = spec["model"]["vocab"]
    vocab["a"], vocab["b"] = vocab["b"], vocab["a"]  # same size, two ids swapped: the sizes alone cannot tell
    (tmp_path / "critic" / "tokenizer.json").write_text(json.dumps(spec))
    cfg = make_config(tmp_path / "run", corpus, "objective=avatarl", f"critic={tmp_path / 'critic'}")
    with pytest.raises(ValueError, match="another tokenizer"):
        pretrain.train(cfg)


def test_top_k_larger_than_vocabulary_refused(tmp_path, corpus, critic_dir, no_training):
    cfg = make_config(tmp_path / "run", corpus, "objective=avatarl", f"critic={critic_dir}", "top_k=103")
    with pytest.raises(ValueError, match=r"top_k=103 is larger than the vocabulary of 102 tokens"):
        pretrain.train(cfg)
    assert not (tmp_path / "run").exists()


@pytest.mark.parametrize(
    "overrides, message",
    [
        (["objective=avatarl", "critic=builtin:tiny"], "randomly initialised"),
        (["objective=avatarl", "critic=./no/such/critic"], "does not exist"),
        (["model_args.max_position_embeddings=16"], r"block_size=32 is longer than the model's context"),
    ],
)
def test_other_bad_input_refused(tmp_path, corpus, no_training, overrides, message):
    with pytest.raises((ValueError, FileNotFoundError), match=message):
        pretrain.train(make_config(tmp_path / "run", corpus, *overrides))
    assert not (tmp_path / "run").exists()


# --------------------------------------------------------------------------- experiment helpers


def _experiment_plot_module():
    import importlib.util

    path = Path(__file__).resolve().parents[2] / "experiments" / "avatarl" / "plot.py"
    spec = importlib.util.spec_from_file_location("avatarl_experiment_plot", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_experiment_tokens_to_reach_and_mean_curve_by_hand():
    plot = _experiment_plot_module()
    points = [(0, 4.0), (100, 3.0), (200, 2.0), (300, 1.5)]
    # 2.5 lies halfway between (100, 3.0) and (200, 2.0) -> 150; 1.75 halfway between 200 and 300 -> 250.
    assert plot.tokens_to_reach(points, 2.5) == pytest.approx(150.0)
    assert plot.tokens_to_reach(points, 1.75) == pytest.approx(250.0)
    assert plot.tokens_to_reach(points, 3.0) == 100  # reached exactly at an evaluation
    assert plot.tokens_to_reach(points, 1.0) is None  # never reached
    # pointwise mean of [4, 2] and [2, 1] at the same token counts -> [3, 1.5]
    assert plot.mean_curve([[(0, 4.0), (10, 2.0)], [(0, 2.0), (10, 1.0)]]) == [(0, 3.0), (10, 1.5)]
    with pytest.raises(ValueError, match="different token counts"):
        plot.mean_curve([[(0, 4.0)], [(5, 2.0)]])
