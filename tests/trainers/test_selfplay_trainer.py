"""Language Self-Play trainer: the query environment, config checks, malformed queries, a short verifiable run."""

import json
import shutil

import pytest
import torch

from lmrl.config import ConfigError, load_config
from lmrl.data.tokenizers import build_char_tokenizer
from lmrl.models import load_model
from lmrl.rewards.self_reward import SelfReward, parse_score, quality_prompt
from lmrl.tracking import read_jsonl
from lmrl.trainers.selfplay import trainer as selfplay
from tests.helpers import ONE_LAYER_ARGS, TINY

CHAIN_SUM = "State the final answer to the following arithmetic problem: "  # reasoning-gym chain_sum's prompt
VERIFIABLE = ["verifier=arithmetic", "rewards=[task]", "challenger_prompt=short", "task=arithmetic", "template={}+{}="]


pytestmark = pytest.mark.usefixtures("one_thread")  # tests/conftest.py


def sp_config(tmp_path, *overrides):
    return load_config(
        selfplay.SelfPlayConfig,
        None,
        [
            f"output_dir={tmp_path / 'run'}",
            "precision=fp32",
            *TINY,
            *VERIFIABLE,
            "variant=lsp_zero",
            "queries_per_step=4",
            "answers_per_query=2",
            "challenger_max_new_tokens=8",
            "solver_max_new_tokens=4",
            "log_every=1",
            "eval_every=0",
            "save_every=0",
            "sample_every=100",
            "lr=1e-2",
            *overrides,
        ],
    )


# ----------------------------------------------------------------------------- the environment


@pytest.mark.parametrize(
    "text, kwargs, expected",
    [
        ("12+34=", {}, ("12+34=", "46")),
        (" 12 + 34 ", {}, ("12+34=", "46")),  # spaces and the final '=' are optional
        ("9-20=", {}, ("9-20=", "-11")),
        ("5+6-7=", {}, ("5+6-7=", "4")),
        ("0+7=", {}, ("0+7=", "7")),
        ("8/2=", {"ops": "+-*/"}, ("8/2=", "4")),
        ("2+3*4=", {"ops": "+*"}, ("2+3*4=", "14")),  # precedence, computed by lmrl.data.tasks.expr
        ("9-20=", {"negative": False}, None),
        ("7/2=", {"ops": "+-*/"}, None),  # not an integer
        ("8/0=", {"ops": "+-*/"}, None),
        ("12*3=", {}, None),  # '*' not in ops
        ("1234+1=", {}, None),  # more than max_digits digits
        ("1+2+3+4=", {}, None),  # more than max_operands operands
        ("07+1=", {}, None),  # leading zero
        ("5=", {}, None),  # one operand
        ("(1+2)+3=", {}, None),  # no parentheses
        ("-5+3=", {}, None),  # no unary minus
        ("1++2=", {}, None),
        ("__import__('os').system('x')", {}, None),
        ("12+34=46", {}, None),  # an answer leaked into the query
        ("", {}, None),
        ("\n\n", {}, None),
        # prefix: reasoning-gym chain_sum's format, kept in what the Solver sees
        (f"{CHAIN_SUM} 5 - 9 =", {"prefix": CHAIN_SUM}, (f"{CHAIN_SUM}5 - 9 =", "-4")),
        (f"{CHAIN_SUM}3+4", {"prefix": CHAIN_SUM}, (f"{CHAIN_SUM}3+4 =", "7")),
        ("3+4=", {"prefix": CHAIN_SUM}, None),  # the instruction is missing
        (f"Say {CHAIN_SUM}3+4=", {"prefix": CHAIN_SUM}, None),
        (f"{CHAIN_SUM}three plus four", {"prefix": CHAIN_SUM}, None),
    ],
)
def test_arithmetic_query(text, kwargs, expected):
    query = selfplay.arithmetic_query(text, **kwargs)
    if expected is None:
        assert query is None
    else:
        assert (query.text, query.columns["answer"]) == expected
        assert query.columns["task"] == "arithmetic"


def test_arithmetic_query_logs_operands_and_digits():
    query = selfplay.arithmetic_query("123+4-56=")
    assert query.stats == {"operands": 3.0, "max_digits": 3.0}


def test_open_query_strips_generation_tags_and_rejects_empty():
    assert selfplay.open_query("[Start Generation] Explain tides.\n[End Generation]").text == "Explain tides."
    assert selfplay.open_query("  [Start Generation][End Generation] ") is None
    assert selfplay.open_query("") is None


def test_challenger_prompt_fills_task_and_template(tmp_path):
    config = sp_config(tmp_path, "template={}-{}=")
    assert selfplay.challenger_text(config) == "Write one arithmetic problem like {}-{}="
    config = sp_config(tmp_path, "challenger_prompt=lsp", "task=", "template=")
    text = selfplay.challenger_text(config)
    assert "for the task 'None'" in text and "[Start Generation]\nNone\n[End Generation]" in text
    config = sp_config(tmp_path, "challenger_prompt=Ask about {task}.", "task=tides")
    assert selfplay.challenger_text(config) == "Ask about tides."


@pytest.mark.parametrize(
    "overrides, message",
    [
        (["rewards=[]"], "selfplay needs R"),
        (["verifier=none"], "needs each query's true answer"),
        (["query_args.max_digit=3"], "query_args"),
        (["judge_prompt=Rate this."], "judge_prompt"),
        (["adv_scale=std", "answers_per_query=1"], "adv_scale=std"),
        (["queries_per_step=0"], "queries_per_step"),
        (["reward_weights=[1.0, 2.0]"], "reward_weights"),
    ],
)
def test_bad_config_fails_at_start_up(tmp_path, overrides, message):
    with pytest.raises(ConfigError, match=message):
        sp_config(tmp_path, *overrides)


@pytest.mark.parametrize(
    "overrides, message",
    [
        (["verifier=none", "rewards=[no_such_reward]"], "no_such_reward"),
        (["warm_start_steps=2", "warm_start_task_args=[{digitz: 1}]"], "digitz"),
        (["eval_dataset=task:no_such_task"], "no_such_task"),
    ],
)
def test_bad_input_fails_before_the_run_directory_and_any_model_call(tmp_path, monkeypatch, overrides, message):
    def fail(*args, **kwargs):
        raise AssertionError("the warm start or a self-play step ran before the bad input was refused")

    monkeypatch.setattr(selfplay, "warm_start", fail)
    monkeypatch.setattr(selfplay, "selfplay_step", fail)
    with pytest.raises(ValueError, match=message):
        selfplay.train(sp_config(tmp_path, *overrides))
    assert not (tmp_path / "run").exists()


# ----------------------------------------------------------------------------- runs


def test_random_model_writes_only_malformed_queries_and_the_run_goes_on(tmp_path):
    # a random char model never writes a valid problem: no Solver rows, the Challenger still trains
    result = selfplay.train(sp_config(tmp_path, "max_steps=3", "kl_coef=0.1", "sample_every=1"))
    records = [r for r in read_jsonl(tmp_path / "run" / "metrics.jsonl") if r["step"] > 0 and "challenger/loss" in r]
    assert [r["step"] for r in records] == [1, 2, 3]
    assert all(r["challenger/malformed_frac"] == 1.0 and "solver/loss" not in r for r in records)
    # every query earns malformed_reward, so A_Ch = 0, and the policy is still the reference (k3 gradient 0 there):
    # a step with no signal must leave the model exactly as it was
    assert all(r["optim/grad_norm"] == 0.0 and r["loss"] == 0.0 and r["challenger/kl"] == 0.0 for r in records)
    samples = read_jsonl(tmp_path / "run" / "samples.jsonl")
    assert any(s.get("valid") is False and s["challenger_reward"] == -1.0 for s in samples)
    assert result == {}  # no eval_dataset: nothing evaluated


def test_reasoning_gym_problems_warm_start_check_and_evaluate_a_run(tmp_path):
    # rg:chain_sum rows teach the formats and are the held-out set (scored by reasoning-gym's verifier); the
    # Challenger's queries must be chain_sum problems (prefix) whose sums the environment computes
    pytest.importorskip("reasoning_gym")
    args = "{min_terms: 2, max_terms: 2, min_digits: 1, max_digits: 1, allow_negation: false}"
    config = sp_config(
        tmp_path,
        "max_steps=2",
        "eval_every=2",
        "warm_start_dataset=rg:chain_sum",
        f"warm_start_task_args=[{args}]",
        "warm_start_rows=32",
        "warm_start_steps=2",
        "eval_dataset=rg:chain_sum",
        f"eval_task_args={args}",
        "eval_rows=8",
        "challenger_max_new_tokens=4",
        f"query_args={{max_digits: 1, max_operands: 2, prefix: '{CHAIN_SUM}'}}",
    )
    examples = selfplay.warm_start_examples(config, build_char_tokenizer())
    assert len(examples) == 64  # (<cp> -> problem) and (problem -> answer) for each of the 32 rows
    result = selfplay.train(config)
    assert 0.0 <= result["eval/accuracy"] <= 1.0 and 0.0 < result["eval/answer_prob"] < 1.0
    records = read_jsonl(tmp_path / "run" / "metrics.jsonl")
    assert "eval/accuracy" in records[0] and [r["step"] for r in records if "challenger/loss" in r] == [1, 2]
    # 4 new characters cannot hold the 62-character instruction: every query is malformed, none is answered
    assert all(r["challenger/malformed_frac"] == 1.0 for r in records if "challenger/loss" in r)


def one_plus_one(text, **kwargs):
    """A stand-in verifier that accepts a query iff its length is even (deterministic, about half of them)."""
    return selfplay.Query("1+1=", {"task": "arithmetic", "answer": "2", "meta": {}}, {}) if len(text) % 2 == 0 else None


def test_mixed_valid_and_malformed_queries_train_both_roles(tmp_path, monkeypatch):
    monkeypatch.setitem(selfplay.QUERY_CHECKERS, "arithmetic", one_plus_one)
    seen = []
    real_update = selfplay.update

    def spy(parts, roles, *args):
        before = {n: p.detach().clone() for n, p in parts.model.named_parameters()}
        stats = real_update(parts, roles, *args)
        unchanged = [n for n, p in parts.model.named_parameters() if torch.equal(p, before[n])]
        seen.append(({name: (0 if batch is None else len(batch)) for name, batch, _, _ in roles}, unchanged))
        return stats

    monkeypatch.setattr(selfplay, "update", spy)
    selfplay.train(sp_config(tmp_path, "max_steps=3", "queries_per_step=4", "answers_per_query=3"))
    records = [r for r in read_jsonl(tmp_path / "run" / "metrics.jsonl") if "challenger/loss" in r]
    for record, (rows, unchanged) in zip(records, seen):
        answered = round(4 * (1 - record["challenger/malformed_frac"]))
        assert rows == {"challenger": 4, "solver": answered * 3}
        if 0 < answered < 4:  # both roles have a signal: every parameter moves
            assert unchanged == [] and "solver/loss" in record
    assert any(0 < r["challenger/malformed_frac"] < 1 for r in records)


def test_lsp_self_reward_falls_back_on_unparseable_judgements_and_counts_them(tmp_path, monkeypatch):
    monkeypatch.setitem(
        selfplay.QUERY_CHECKERS,
        "arithmetic",
        lambda text, **kw: selfplay.Query("1+1=", {"task": "arithmetic", "answer": "2", "meta": {}}, {}),
    )
    selfplay.train(
        sp_config(
            tmp_path,
            "max_steps=2",
            "variant=lsp",
            "self_reward_fallback=0.5",
            "self_reward_weight=2.0",
            "sample_every=1",
            "judge_prompt=Q: {instruction} A: {response} Score:",
            "judge_max_new_tokens=4",
        )
    )
    records = [r for r in read_jsonl(tmp_path / "run" / "metrics.jsonl") if "challenger/loss" in r]
    # a random model never writes <Score>k</Score>: every one of the 4 x 2 answers gets the fallback 0.5
    assert [r["step"] for r in records] == [1, 2]  # no step was skipped
    assert [r["reward/self_reward/parse_failures"] for r in records] == [8.0, 8.0]
    assert [r["reward/self_reward/parse_failures_total"] for r in records] == [8.0, 16.0]
    assert all(r["reward/self_reward/mean"] == 0.5 and r["reward/self_reward/parse_fail_frac"] == 1.0 for r in records)
    # the fallback enters the Challenger reward: rq = weight * fallback = 2 * 0.5 = 1 for every answer, so
    # c_i = -V(q_i) + V_Q(q_i) = -pass_rate_i + 1 (a malformed-free batch: every query is 1+1=)
    samples = [s for s in read_jsonl(tmp_path / "run" / "samples.jsonl") if "pass_rate" in s]
    assert len(samples) == 2 * 4
    assert all(s["challenger_reward"] == pytest.approx(1.0 - s["pass_rate"], abs=1e-6) for s in samples)
    # the reward R itself is untouched by the fallback: a 0/1 task verifier
    assert all(s["reward"] in (0.0, 1.0) for s in samples)


def test_a_reward_model_trained_with_lmrl_reward_is_R(tmp_path):
    # R = a scalar reward model saved as `lmrl reward` saves one, given as rewards=[model:PATH]; open queries
    # (verifier=none): any non-empty text the random model writes is a query, and the RM scores every answer
    from lmrl.data.tokenizers import build_char_tokenizer
    from lmrl.models.reward import RewardModel, load_reward_model
    from lmrl.rewards.reward_model import score_texts

    tok = build_char_tokenizer()
    rm = RewardModel(
        load_model(
            "builtin:tiny",
            tok,
            seed=7,
            model_args=ONE_LAYER_ARGS,
        ),
        "bt",
        seed=7,
    )
    rm.save_pretrained(tmp_path / "rm")
    tok.save_pretrained(tmp_path / "rm")
    selfplay.train(
        sp_config(
            tmp_path,
            "verifier=none",
            f"rewards=[model:{tmp_path / 'rm'}]",
            "max_steps=2",
            "sample_every=1",
            "challenger_prompt=Ask something.",
            "reward_kwargs={reward_model: {precision: fp32}}",
        )
    )  # as score_texts below
    records = [r for r in read_jsonl(tmp_path / "run" / "metrics.jsonl") if "challenger/loss" in r]
    assert [r["step"] for r in records] == [1, 2] and all("reward/reward_model/mean" in r for r in records)
    rm, rm_tok = load_reward_model(tmp_path / "rm")
    samples = [s for s in read_jsonl(tmp_path / "run" / "samples.jsonl") if "reward" in s]
    assert samples
    for s in samples:  # the logged reward is the RM's score of (query, answer), with EOS (finished) or without
        args = ([selfplay.open_query(s["query"]).text], [s["answer"]], 1, None)
        candidates = [score_texts(rm, rm_tok, *args, finished=[f])[0] for f in (True, False)]
        assert min(abs(s["reward"] - c) for c in candidates) < 1e-5, (s, candidates)
        assert s["challenger_reward"] == pytest.approx(-s["pass_rate"], abs=1e-6)  # LSP-Zero: c = -V(q)


def test_resume_continues_exactly(tmp_path, monkeypatch):
    monkeypatch.setitem(selfplay.QUERY_CHECKERS, "arithmetic", one_plus_one)
    args = [
        "max_steps=4",
        "kl_coef=0.1",
        "save_every=2",
        "warm_start_steps=2",
        "warm_start_rows=16",
        "warm_start_batch_size=8",
        "warm_start_task_args=[{digits: 1}]",
    ]
    selfplay.train(sp_config(tmp_path, *args, f"output_dir={tmp_path / 'full'}"))
    full = read_jsonl(tmp_path / "full" / "metrics.jsonl")
    # a run stopped after step 2 (its checkpoint) and resumed gives the same steps 3-4
    selfplay.train(sp_config(tmp_path, *args, "max_steps=2", f"output_dir={tmp_path / 'cut'}"))
    shutil.rmtree(tmp_path / "cut" / "final")
    selfplay.train(sp_config(tmp_path, *args, "resume=true", f"output_dir={tmp_path / 'cut'}"))
    resumed = read_jsonl(tmp_path / "cut" / "metrics.jsonl")
    keys = ("challenger/loss", "solver/loss", "challenger/kl", "solver/kl", "optim/grad_norm")
    after = [[r.get(k) for k in keys] for r in full if r["step"] > 2 and "optim/grad_norm" in r]
    assert after and all(row[-1] > 0 for row in after)  # steps 3-4 really trained
    assert [[r.get(k) for k in keys] for r in resumed if r["step"] > 2 and "optim/grad_norm" in r] == after
    for name in ("full", "cut"):  # the resumed run reloaded the post-warm-start reference model
        assert (tmp_path / name / "reference" / "config.json").exists()


def test_short_verifiable_run_changes_parameters_and_raises_solver_reward(tmp_path):
    # Warm start (SFT on both roles' formats, 1-digit additions), then 30 self-play steps in which the Challenger
    # writes 1-digit additions, the environment computes their sums and the Solver is rewarded by the task verifier.
    # The Solver's reward is measured on all 100 one-digit additions as eval/answer_prob = mean_i pi(answer_i + EOS),
    # its exact expected pass@1 at temperature 1 (no sampling noise, and the run is deterministic for a seed: two
    # runs of seed 0 gave the same numbers to the last digit). Measured: seed 0 (this test) 0.1588 -> 0.1776
    # (+0.0189); seeds 1/2 gave +0.0074/+0.0199, so a threshold of +0.005 holds with a margin on every seed tried.
    problems = tmp_path / "additions.jsonl"
    problems.write_text(
        "".join(
            json.dumps(
                {
                    "prompt": f"{a}+{b}=",
                    "completion": str(a + b),
                    "answer": str(a + b),
                    "task": "arithmetic",
                    "meta": {},
                }
            )
            + "\n"
            for a in range(10)
            for b in range(10)
        )
    )
    config = sp_config(
        tmp_path,
        "model_args.hidden_size=64",
        "model_args.intermediate_size=128",
        "challenger_prompt=New problem?",
        "query_args={max_digits: 1, max_operands: 2, ops: '+'}",
        "warm_start_task_args=[{digits: 1, ops: '+'}]",
        "warm_start_rows=200",
        "warm_start_batch_size=32",
        "warm_start_steps=200",
        "warm_start_lr=3e-3",
        "queries_per_step=16",
        "answers_per_query=16",
        "challenger_max_new_tokens=6",
        "solver_max_new_tokens=4",
        f"eval_dataset={problems}",
        "eval_rows=100",
        "max_steps=30",
        "lr=3e-4",
        "log_every=5",
    )
    result = selfplay.train(config)
    assert result["eval/answer_prob"] > result["initial/eval/answer_prob"] + 0.005, result
    reference = load_model(str(tmp_path / "run" / "reference"))
    final = load_model(str(tmp_path / "run" / "final"))
    unchanged = [n for (n, p), q in zip(final.named_parameters(), reference.parameters()) if torch.equal(p, q)]
    assert unchanged == []
    records = [r for r in read_jsonl(tmp_path / "run" / "metrics.jsonl") if "challenger/malformed_frac" in r]
    assert all(r["challenger/malformed_frac"] < 0.5 for r in records)  # the warm-started Challenger writes problems


@pytest.mark.parametrize(
    "override, message",
    [
        ("queries_per_step=0", "'queries_per_step' must be >= 1"),
        ("answers_per_querry=4", "answers_per_query"),  # a typo: the message suggests the key
        ("variant=lsp_zeroo", "variant"),
        ("verifier=none", "needs each query's true answer"),
    ],
)
def test_cli_rejects_a_bad_override_with_exit_2_and_no_run(tmp_path, capsys, override, message):
    from lmrl.cli import main

    code = main(["selfplay", "--config", "selfplay/tiny_arithmetic", f"output_dir={tmp_path / 'run'}", override])
    out = " ".join(capsys.readouterr().out.split())  # rich wraps long lines
    assert code == 2 and "error:" in out and message in out, out
    assert "Traceback" not in out and not (tmp_path / "run").exists()


# ----------------------------------------------------------------------------- the quality self-reward (LSP Box 3)


@pytest.mark.parametrize(
    "judgement, expected",
    [
        ("Clear task. <Calculation>1+1+1+1+1+0+0=5</Calculation> <Score>5</Score>", 5),
        ("<Score>2</Score> on second thought <Score>6</Score>", 6),  # the last tag counts
        ("<Score> 7 </Score>", 7),
        ("<score>4</score>", 4),
        ("<Score>0</Score>", 0),
        ("<Score>8</Score>", None),  # outside 0..7
        ("<Score>-1</Score>", None),
        ("<Score>3.5</Score>", None),
        ("<Calculation>1+1=2</Calculation>", None),  # no Score tag
        ("Score: 5", None),
        ("", None),
        (None, None),
    ],
)
def test_parse_score(judgement, expected):
    assert parse_score(judgement) == expected


def test_quality_prompt_has_the_seven_criteria_and_keeps_braces():
    text = quality_prompt("Fill {} in.", "Done {x}.")
    assert "<Instruction>Fill {} in.</Instruction>\n<Response>Done {x}.</Response>" in text
    assert all(f"\n{k}. " in text for k in range(1, 8)) and "<Score>k</Score>" in text


def test_self_reward_falls_back_counts_failures_and_shows_the_judge_the_interaction():
    from lmrl.models import load_model_and_tokenizer

    model, tokenizer = load_model_and_tokenizer(
        "builtin:tiny",
        model_args=ONE_LAYER_ARGS,
    )
    judge = SelfReward(
        model, tokenizer, template="I: {instruction} R: {response}", fallback=-1.0, max_new_tokens=2, batch_size=2
    )
    seen = []
    real_generate = judge.engine.generate

    def spy(ids, params, n=1, generator=None):
        seen.extend(tokenizer.decode(x) for x in ids)
        return real_generate(ids, params, n=n, generator=generator)

    judge.engine.generate = spy
    judge([" q1", "q2", "q3"], ["a1", "a2", "a3"])
    assert len(seen) == 3 and "I:  q1 R: a1" in seen[0] and "I: q3 R: a3" in seen[2]  # batches of 2, then 1
    judge.judge = lambda prompts, completions: ["<Score>6</Score>", "no score", "<Score>9</Score>"]
    assert judge(["q"] * 3, ["a"] * 3) == [6.0, -1.0, -1.0]
    assert judge.last_stats == {"parse_failures": 2.0, "parse_fail_frac": 2 / 3}
    assert judge.failures == 3 + 2  # the random model's three judgements failed too
    with pytest.raises(ValueError, match=r"\{response\}"):
        SelfReward(model, tokenizer, template="Rate {instruction}.")
