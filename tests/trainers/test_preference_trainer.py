"""DPO family: log-probs by hand, cached reference == on-the-fly, every loss runs, KTO data, gold score rises,
resume reuses the cache, and bad input is caught at start-up with the row named."""

import json
from pathlib import Path

import pytest
import torch

from lmrl.algorithms import PREFERENCE_LOSSES, RunningDelta
from lmrl.config import ConfigError, load_config
from lmrl.data import preference as prefs
from lmrl.data.tokenizers import build_char_tokenizer
from lmrl.models import load_model
from lmrl.tracking import read_jsonl
from lmrl.trainers.dpo import common as dpo_common
from lmrl.trainers.dpo import trainer as preference
from lmrl.trainers.sft import trainer as sft
from tests.helpers import PREFERENCE_RUN, TINY, TINY_ARGS


def config(tmp_path, *overrides, builtin=True, name="run"):
    digits = ["data_args.digits=1"] if builtin else []
    return load_config(
        preference.DPOConfig, None, [f"output_dir={tmp_path / name}", "precision=fp32", *TINY, *digits, *overrides]
    )


@pytest.fixture(scope="module")
def tok():
    return build_char_tokenizer()


def test_sequence_logps_match_a_direct_computation(tok):
    model = load_model("builtin:tiny", tok, seed=0, model_args=TINY_ARGS).eval()
    seqs = [prefs.tokenize(tok, "1+1=", "2"), prefs.tokenize(tok, "12+34=", "the answer is 46")]
    logps, lengths = dpo_common.sequence_logps(model, seqs, tok.pad_token_id, None)
    for s, got, n in zip(seqs, logps, lengths):
        ids = torch.tensor([s.prompt_ids + s.completion_ids])
        logits = model(input_ids=ids).logits[0]  # (L, V), no padding at all
        p = len(s.prompt_ids)
        # log π(y|x) = Σ_t log softmax(logits[t-1])[y_t] over completion positions t = p .. L-1
        expected = sum(torch.log_softmax(logits[t - 1], -1)[ids[0, t]] for t in range(p, ids.shape[1]))
        assert got.item() == pytest.approx(expected.item(), abs=1e-4)
        assert n.item() == len(s.completion_ids)


def test_packed_sequence_logps_equal_the_padded_ones(tok):
    model = load_model("builtin:tiny", tok, seed=0, model_args=TINY_ARGS).eval()
    seqs = [
        prefs.tokenize(tok, "1+1=", "2"),
        prefs.tokenize(tok, "12+34=", "the answer is 46"),
        prefs.tokenize(tok, "7*8=", "56"),
    ]
    padded, counts = dpo_common.sequence_logps(model, seqs, tok.pad_token_id, None)
    packed, packed_counts = dpo_common.sequence_logps(model, seqs, tok.pad_token_id, None, packed=True)
    torch.testing.assert_close(packed, padded, rtol=0, atol=1e-5)
    assert packed_counts.tolist() == counts.tolist()


def test_packed_dpo_step_gives_the_padded_loss_and_gradients(tmp_path, tok):
    padded_cfg = config(tmp_path, *PREFERENCE_RUN, "max_length=64")
    packed_cfg = config(tmp_path, *PREFERENCE_RUN, "max_length=64", "max_tokens_per_microbatch=160")
    examples, _ = dpo_common.build_examples(
        prefs.load_preference_rows("builtin:prefs", "train", 8, digits=1), tok, padded_cfg, "rows"
    )
    parts = dpo_common.micro_batches(examples, packed_cfg, len(examples))
    assert 1 < len(parts) < len(examples)  # several pairs per packed row, several rows
    results = []
    for cfg in (padded_cfg, packed_cfg):
        model = load_model("builtin:tiny", tok, seed=0, model_args=TINY_ARGS)
        ref = torch.zeros(len(examples), 2)
        stats = dpo_common.train_step(model, examples, ref, cfg, tok.pad_token_id, None, 1, RunningDelta())
        results.append((stats, {n: p.grad.clone() for n, p in model.named_parameters() if p.grad is not None}))
    (padded, g_padded), (packed, g_packed) = results
    assert packed["loss"] == pytest.approx(padded["loss"], abs=1e-5)
    for name, grad in g_packed.items():
        torch.testing.assert_close(grad, g_padded[name], rtol=1e-4, atol=1e-5)


def test_packing_refuses_grad_accum_unpaired_losses_and_too_small_budgets(tmp_path):
    for overrides in (
        ["grad_accum=2", "max_tokens_per_microbatch=512"],
        ["loss=kto", "max_tokens_per_microbatch=512"],
        ["max_length=256", "max_tokens_per_microbatch=300"],
    ):
        with pytest.raises(ConfigError, match="max_tokens_per_microbatch"):
            config(tmp_path, *overrides)


def test_first_dpo_loss_is_log2_and_logps_are_logged(tmp_path):
    cfg = config(tmp_path, *PREFERENCE_RUN, "max_steps=2")
    result = preference.train(cfg)
    first = read_jsonl(Path(cfg.output_dir) / "metrics.jsonl")[1]
    # the policy starts equal to π_ref: h = 0, L = -log σ(0) = log 2
    assert first["step"] == 1 and first["loss"] == pytest.approx(0.693147, abs=1e-5)
    assert first["policy/reward_margin"] == pytest.approx(0.0, abs=1e-6)
    assert result["initial/eval/loss"] == pytest.approx(0.693147, abs=1e-5)
    for key in (
        "policy/logp_chosen",
        "policy/logp_rejected",
        "policy/reward_chosen",
        "policy/reward_rejected",
        "policy/reward_accuracy",
    ):
        assert key in first
    assert "eval/gold_score" in result and (Path(cfg.output_dir) / "final" / "config.json").exists()


def test_cached_reference_equals_on_the_fly_reference(tmp_path):
    cached = preference.train(config(tmp_path, *PREFERENCE_RUN, "max_steps=4", "lr=1e-2", name="cached"))
    fly = preference.train(
        config(tmp_path, *PREFERENCE_RUN, "max_steps=4", "lr=1e-2", "precompute_ref=false", name="fly")
    )
    assert (tmp_path / "cached" / preference.REF_CACHE).exists() and not (
        tmp_path / "fly" / preference.REF_CACHE
    ).exists()
    a, b = read_jsonl(tmp_path / "cached" / "metrics.jsonl"), read_jsonl(tmp_path / "fly" / "metrics.jsonl")
    assert [r["step"] for r in a] == [r["step"] for r in b]
    assert a[-2]["loss"] != pytest.approx(0.693147, abs=1e-3)  # the policy moved away from the reference
    for x, y in zip(a, b):
        for key in ("loss", "policy/reward_margin", "policy/reward_chosen", "policy/logp_chosen", "eval/loss"):
            if key in x:
                assert y[key] == pytest.approx(x[key], abs=1e-5), (x["step"], key)
    assert fly["eval/loss"] == pytest.approx(cached["eval/loss"], abs=1e-5)


def test_resume_reuses_the_reference_cache(tmp_path, monkeypatch):
    args = [*PREFERENCE_RUN, "max_steps=4", "save_every=2", "keep_checkpoints=5"]
    preference.train(config(tmp_path, *args))
    full = read_jsonl(tmp_path / "run" / "metrics.jsonl")
    for step in ("step-4",):
        import shutil

        shutil.rmtree(tmp_path / "run" / "checkpoints" / step)

    def no_recompute(*a, **k):
        raise AssertionError("reference log-probs were recomputed on resume")

    monkeypatch.setattr(preference, "reference_logps", no_recompute)
    preference.train(config(tmp_path, *args, "resume=true"))
    resumed = read_jsonl(tmp_path / "run" / "metrics.jsonl")
    assert [r["step"] for r in resumed] == [r["step"] for r in full]
    for x, y in zip(full, resumed):
        for key in ("loss", "optim/grad_norm", "eval/loss"):
            if key in x:
                assert y[key] == pytest.approx(x[key], rel=1e-5, abs=1e-7), (x["step"], key)


def test_reference_fingerprint_follows_weights_precision_and_tokens(tok):
    model = load_model("builtin:tiny", tok, seed=0, model_args=TINY_ARGS)
    examples = [dpo_common.Example((prefs.tokenize(tok, "1+1=", "2"), prefs.tokenize(tok, "1+1=", "3")))]
    key = preference.fingerprint(model, "fp32", examples, [])
    assert (
        preference.fingerprint(load_model("builtin:tiny", tok, seed=0, model_args=TINY_ARGS), "fp32", examples, [])
        == key
    )
    assert (
        preference.fingerprint(load_model("builtin:tiny", tok, seed=1, model_args=TINY_ARGS), "fp32", examples, [])
        != key
    )
    assert preference.fingerprint(model, "bf16", examples, []) != key
    assert preference.fingerprint(model, "fp32", examples[::-1] + examples, []) != key


def test_kto_balance_warning(tmp_path):
    printed = []
    tracker = type("T", (), {"print": lambda self, msg: printed.append(msg)})()
    examples = [dpo_common.Example((None, None), label) for label in (1, 0, 0, 0)]
    preference.check_kto_balance(examples, config(tmp_path, "loss=kto"), tracker)
    assert "λD·nD / (λU·nU) = 0.33 with 1 desirable and 3 undesirable" in printed[0]
    preference.check_kto_balance(examples, config(tmp_path, "loss=kto", "loss_args.lambda_d=3.5"), tracker)
    assert len(printed) == 1  # 3.5·1 / (1·3) = 1.17 is inside [1, 4/3]


@pytest.mark.parametrize("loss", PREFERENCE_LOSSES.names())
def test_every_registered_loss_trains(tmp_path, loss):
    cfg = config(tmp_path, *PREFERENCE_RUN, "max_steps=2", f"loss={loss}", "lr=1e-2")
    result = preference.train(cfg)
    steps = [r for r in read_jsonl(Path(cfg.output_dir) / "metrics.jsonl") if "loss" in r]
    assert len(steps) == 2 and all(torch.isfinite(torch.tensor(r["loss"])) for r in steps)
    assert torch.isfinite(torch.tensor(result["eval/loss"]))
    assert (Path(cfg.output_dir) / preference.REF_CACHE).exists() == cfg.uses_reference


def test_kto_builds_unpaired_examples_from_pairs_and_files(tmp_path, tok):
    cfg = config(tmp_path, "loss=kto")
    rows = prefs.preference_rows(6, digits=1)
    examples, _ = dpo_common.build_examples(rows, tok, cfg, "rows")
    assert [e.label for e in examples] == [1, 0] * 6  # each pair: chosen desirable, rejected undesirable
    for e, (row, label) in zip(examples, [(r, k) for r in rows for k in ("chosen", "rejected")]):
        assert e.seqs[0] == prefs.tokenize(tok, row["prompt"], row[label])
        assert e.seqs[1].prompt_ids == e.seqs[0].prompt_ids  # z0 pair: same prompt ...
        assert e.seqs[1].completion_ids != e.seqs[0].completion_ids  # ... with another prompt's completion
    unpaired = [{"prompt": "1+1=", "completion": "2", "label": True}, {"prompt": "2+2=", "completion": "5", "label": 0}]
    examples, _ = dpo_common.build_examples(unpaired, tok, cfg, "rows")
    assert [e.label for e in examples] == [1, 0]
    assert examples[0].seqs[1] == prefs.tokenize(tok, "1+1=", "5")
    with pytest.raises(ValueError, match="two different prompts"):
        dpo_common.build_examples(unpaired[:1], tok, cfg, "rows")


def test_bco_keeps_a_running_mean_of_implicit_rewards(tmp_path):
    cfg = config(tmp_path, *PREFERENCE_RUN, "max_steps=3", "loss=bco", "save_every=3")
    preference.train(cfg)
    from lmrl.trainers import common

    state = common.read_state(common.latest_checkpoint(cfg.output_dir))["trainer"]
    total, count = state["bco"]
    assert count == 3 * 8 * 2  # 3 steps x 8 pairs x (chosen, rejected)
    assert total != 0.0


@pytest.mark.slow  # ~2-4 min on 2 shared cores: SFT then DPO with sampled held-out answers
def test_dpo_raises_the_gold_score_of_the_policy(tmp_path):
    """SFT a random tiny model on every completion of the preference data (so π_ref generates the kinds of answers
    the pairs rank: junk, verbose, wrong, right), then DPO: the mean hidden gold score of its sampled answers to
    held-out prompts rises, and log π of both chosen and rejected answers falls, rejected much more."""
    data = tmp_path / "sft.jsonl"
    data.write_text("".join(json.dumps(r) + "\n" for r in prefs.completion_rows(prefs.preference_rows(1000, seed=1))))
    common = ["precision=fp32", "eval_every=0", "save_every=0", "log_every=20", "warmup_steps=5", "batch_size=32"]
    sft.train(
        load_config(
            sft.SFTConfig,
            None,
            [
                *common,
                f"output_dir={tmp_path / 'sft'}",
                f"dataset={data}",
                "train_rows=null",
                "max_steps=100",
                "lr=3e-3",
                "max_length=64",
            ],
        )
    )
    result = preference.train(
        load_config(
            preference.DPOConfig,
            None,
            [
                *common,
                f"output_dir={tmp_path / 'dpo'}",
                f"model={tmp_path / 'sft' / 'final'}",
                "train_rows=1000",
                "eval_rows=100",
                "eval_samples=16",
                "max_steps=40",
                "lr=1e-3",
            ],
        )
    )
    assert result["eval/gold_score"] > result["initial/eval/gold_score"] + 0.2, result
    assert result["eval/reward_accuracy"] > 0.7, result  # implicit reward ranks held-out pairs like the gold score
    assert result["eval/logp_chosen"] < result["initial/eval/logp_chosen"], result  # preference displacement
    drop_rejected = result["initial/eval/logp_rejected"] - result["eval/logp_rejected"]
    assert drop_rejected > 2 * (result["initial/eval/logp_chosen"] - result["eval/logp_chosen"]), result


# --------------------------------------------------------------------------- bad input


def write(tmp_path, rows):
    path = tmp_path / "d.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


MSG = lambda role, text: {"role": role, "content": text}  # noqa: E731


@pytest.mark.parametrize(
    "rows, overrides, message",
    [
        (
            [{"prompt": "a", "chosen": "b", "rejected": "c"}, {"prompt": "a", "rejected": "c"}],
            [],
            r"row 2 of .*d\.jsonl: preference rows need `chosen` and `rejected` \(missing \['chosen'\]",
        ),
        ([{"prompt": "a", "chosen": "b", "rejected": "b"}], [], "row 1 of .*identical"),
        ([{"prompt": "a", "completions": ["x", "y", "z"], "ranking": [[0, 1], 2]}], [], "row 1 of .*tied"),
        ([{"prompt": "a", "completions": ["x", "y", "z"], "ranking": [0, 2]}], [], r"row 1 of .*missing \[1\]"),
        (
            [
                {
                    "chosen": [MSG("user", "a"), MSG("assistant", "b")],
                    "rejected": [MSG("user", "A"), MSG("assistant", "c")],
                }
            ],
            [],
            "row 1 of .*different prompts .* differ at message 0: chosen 'a' vs rejected 'A'",
        ),
        ([{"prompt": "a", "chosen": "b", "rejected": "c"}], ["loss=odpo"], "row 1 of .*loss=odpo needs chosen_score"),
        ([{"prompt": "a", "completion": "b", "label": "yes"}], ["loss=kto"], "row 1 of .*label must be one of"),
    ],
    ids=[
        "missing-chosen",
        "identical",
        "ranking-tie",
        "ranking-missing",
        "messages-prefix",
        "odpo-scores",
        "kto-label",
    ],
)
def test_bad_input_fails_before_training(tmp_path, rows, overrides, message):
    cfg = config(tmp_path, f"dataset={write(tmp_path, rows)}", *overrides, builtin=False)
    with pytest.raises(ValueError, match=message):
        preference.train(cfg)
    assert not (tmp_path / "run" / "metrics.jsonl").exists()


def test_bad_reference_model_fails_before_the_run_starts(tmp_path):
    # the reference used to be loaded after the run directory was opened; now the method's construction fails
    for precompute in ("true", "false"):
        with pytest.raises(FileNotFoundError, match="does not exist"):
            preference.train(
                config(tmp_path, *PREFERENCE_RUN, "ref_model=/no/such/model", f"precompute_ref={precompute}")
            )
        assert not (tmp_path / "run").exists()


def test_bad_config():
    with pytest.raises(ValueError, match="Unknown preference loss 'dpoo'. Did you mean 'dpo'"):
        load_config(preference.DPOConfig, None, ["loss=dpoo"])
    with pytest.raises(ConfigError, match="Unknown option 'tau' for preference loss 'dpo'"):
        load_config(preference.DPOConfig, None, ["loss_args.tau=0.1"])
    with pytest.raises(ConfigError, match="not loss_args.beta"):
        load_config(preference.DPOConfig, None, ["loss_args.beta=0.1"])
    assert load_config(preference.DPOConfig, None, ["loss=ipo", "loss_args.tau=0.2"]).loss_options == {"tau": 0.2}
    assert load_config(preference.DPOConfig, None, ["loss=simpo", "beta=2"]).loss_options == {"beta": 2.0}


@pytest.mark.slow  # a CLI subprocess (~8 s): the in-process bad-input tests above cover the messages, SFT's the CLI path
def test_cli_reports_bad_rows_without_a_traceback(tmp_path):
    import subprocess
    import sys

    data = write(tmp_path, [{"prompt": "a", "chosen": "b", "rejected": "c"}, {"prompt": "a", "chosen": "b"}])
    result = subprocess.run(
        [sys.executable, "-m", "lmrl", "dpo", f"dataset={data}", f"output_dir={tmp_path / 'run'}", *TINY],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert result.returncode == 2, result.stderr[-2000:]
    out = " ".join(result.stdout.split())  # rich wraps long lines
    assert "error: row 2 of" in out and "missing ['rejected']" in out, result.stdout
    assert "Traceback" not in result.stdout + result.stderr
    assert not (tmp_path / "run" / "metrics.jsonl").exists()


class _Marker:
    """Pickled into a crafted cache: unpickling it (torch.load without weights_only) would create `path`."""

    def __init__(self, path):
        self.path = str(path)

    def __reduce__(self):
        return (open, (self.path, "w"))


@pytest.mark.parametrize("damage", ["cut", "crafted", "not a cache"])
def test_a_bad_reference_cache_is_rebuilt_and_never_unpickled(tmp_path, capsys, damage):
    # issue 46: a cut reference_logps.pt was a traceback even with overwrite=true; a crafted one ran its code
    cfg = config(tmp_path, *PREFERENCE_RUN, "max_steps=1", "train_rows=16", "eval_rows=8")
    preference.train(cfg)
    cache = Path(cfg.output_dir) / preference.REF_CACHE
    good = torch.load(cache, weights_only=True)
    marker = tmp_path / "ran"
    if damage == "cut":
        cache.write_bytes(cache.read_bytes()[:100])
    elif damage == "crafted":
        torch.save({"fingerprint": good["fingerprint"], "train": _Marker(marker), "eval": good["eval"]}, cache)
    else:
        torch.save({"fingerprint": good["fingerprint"]}, cache)
    capsys.readouterr()
    preference.train(config(tmp_path, *PREFERENCE_RUN, "max_steps=1", "train_rows=16", "eval_rows=8", "overwrite=true"))
    out = " ".join(capsys.readouterr().out.split())
    assert "is unreadable" in out and "computing them again" in out  # rich may wrap the long path
    assert not marker.exists()
    rebuilt = torch.load(cache, weights_only=True)
    assert rebuilt["fingerprint"] == good["fingerprint"] and torch.equal(
        torch.as_tensor(rebuilt["eval"][0]) if isinstance(rebuilt["eval"], list) else rebuilt["eval"],
        torch.as_tensor(good["eval"][0]) if isinstance(good["eval"], list) else good["eval"],
    )
