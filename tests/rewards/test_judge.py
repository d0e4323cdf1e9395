"""LLM judges: verdict parsing, the position-swap combination table, rubric parsing and aggregation by hand,
prompt filling, scripted judges through the real classes, and a random built-in judge whose garbage verdicts
are counted as parse failures, never raised."""

import pytest

from lmrl.data.tokenizers import build_char_tokenizer
from lmrl.models import load_model
from lmrl.rewards import REWARDS, MissingColumnError, RewardSet, make_reward
from lmrl.rewards.judge import PairwiseJudge, RubricJudge
from lmrl.rewards.judge_text import (
    PAIRWISE_PROMPT,
    Criterion,
    aggregate_rubric,
    combine_verdicts,
    disagree,
    fill,
    format_criteria,
    parse_rubric,
    parse_rubric_scores,
    parse_verdict,
    question_text,
)
from tests.helpers import ONE_LAYER_ARGS


@pytest.mark.parametrize(
    "text, expected",
    [
        ("Assistant A is more accurate. [[A]]", "A"),
        ("[[B]]", "B"),
        ("Both are equally good: [[C]]", "C"),
        ("First I thought [[A]], but on reflection [[B]]", "B"),  # the LAST tag counts
        ("verdict: [[ A ]]", "A"),  # spaces inside the brackets are allowed
        ("verdict: [A]", None),  # single brackets are not a tag
        ("verdict: [[a]]", None),  # lowercase is not a tag
        ("[[D]]", None),
        ("[[AB]]", None),
        ("no verdict at all", None),
        ("", None),
    ],
)
def test_parse_verdict(text, expected):
    assert parse_verdict(text) == expected


# first: order (a, b); swapped: order (b, a), where "A" names answer b. Mapped back to (a, b) terms
# swapped A -> B, B -> A, C -> C; a win needs both orders to agree, any other parsed pair is a tie.
SWAP_TABLE = [
    ("A", "B", "A"),  # (a,b) says a; (b,a) says its B = a         -> a in both orders
    ("B", "A", "B"),  # (a,b) says b; (b,a) says its A = b         -> b in both
    ("A", "A", "tie"),  # a first, then b when b is first: position bias
    ("B", "B", "tie"),  # b second in both: position bias the other way
    ("A", "C", "tie"),
    ("C", "B", "tie"),  # tie, then a
    ("B", "C", "tie"),
    ("C", "A", "tie"),
    ("C", "C", "tie"),
    ("A", None, None),
    (None, "B", None),
    (None, None, None),
    ("C", None, None),
]


@pytest.mark.parametrize("first, swapped, expected", SWAP_TABLE)
def test_position_swap_combination_table(first, swapped, expected):
    assert combine_verdicts(first, swapped) == expected


def test_disagreement_is_position_bias():
    # disagree iff both parsed and first != back(swapped): of the 9 parsed pairs, the 2 wins and C/C agree
    parsed = [(f, s) for f, s, _ in SWAP_TABLE if f is not None and s is not None]
    assert [disagree(f, s) for f, s in parsed] == [False, False, True, True, True, True, True, True, False]
    assert not disagree("A", None)


@pytest.mark.parametrize(
    "text, n, max_score, expected",
    [
        ("good [[1: 8]] [[2: 3]]", 2, 10, [8.0, 3.0]),
        ("[[1: 8]] later [[1:6]]", 2, 10, [6.0, None]),  # last tag of an id counts; criterion 2 missing
        ("[[1: 11]] [[2: 10]] [[3: 0]]", 3, 10, [None, 10.0, 0.0]),  # out of range -> unparsed; bounds inclusive
        ("[[1: -1]] [[2: 2.5]] [[4: 3]]", 3, 5, [None, 2.5, None]),  # negative out of range; id 4 > n ignored
        ("[[0: 3]] [[2: x]]", 2, 10, [None, None]),
        ("", 1, 10, [None]),
    ],
)
def test_parse_rubric_scores(text, n, max_score, expected):
    assert parse_rubric_scores(text, n, max_score) == expected


def test_aggregate_rubric_by_hand():
    # weights (3, 1, 2), grades (8, 4, 10) of 10 -> s = (.8, .4, 1): (3·.8 + 1·.4 + 2·1) / 6 = 4.8 / 6 = 0.8
    assert aggregate_rubric([8, 4, 10], [3, 1, 2], 10) == pytest.approx(0.8, abs=1e-12)
    # criterion 2 unparsed: over parsed ones only, (3·.8 + 2·1) / (3 + 2) = 4.4 / 5 = 0.88
    assert aggregate_rubric([8, None, 10], [3, 1, 2], 10) == pytest.approx(0.88, abs=1e-12)
    # a pitfall (w = -2) fully met: (4·1 + 1·.5 - 2·1) / (4 + 1) = 2.5 / 5 = 0.5 (negatives not in the denominator)
    assert aggregate_rubric([5, 2.5, 5], [4, 1, -2], 5) == pytest.approx(0.5, abs=1e-12)
    # pitfall not met (grade 0): (4·1 + 1·.5 + 0) / 5 = 0.9
    assert aggregate_rubric([5, 2.5, 0], [4, 1, -2], 5) == pytest.approx(0.9, abs=1e-12)
    # only the pitfall parsed: no positive weight in P -> failure (None), not a division by zero
    assert aggregate_rubric([None, None, 5], [4, 1, -2], 5) is None
    assert aggregate_rubric([None, None], [1, 1], 10) is None
    with pytest.raises(ValueError, match="one per criterion"):
        aggregate_rubric([1], [1, 2], 10)


def test_parse_rubric_forms_and_errors():
    crit = parse_rubric(
        [
            "Correct",
            {"title": "Concise", "weight": 2, "description": "short"},
            {"criterion": "Rambles", "weight": -1},
            Criterion("Polite", weight=0.5),
        ]
    )
    assert crit == [
        Criterion("Correct"),
        Criterion("Concise", "short", 2.0),
        Criterion("Rambles", "", -1.0),
        Criterion("Polite", "", 0.5),
    ]
    assert parse_rubric('[{"title": "A", "weight": 3}]') == [Criterion("A", "", 3.0)]  # JSON string
    assert format_criteria(crit[1:3]) == "1. Concise: short\n2. Rambles (pitfall)"
    for bad, match in [
        ([], "non-empty list"),
        ("{", "valid JSON"),
        ([{"title": "A", "weight": 0}], "non-zero"),
        ([{"title": "A", "weight": "high"}], "give a number"),
        ([{"desc": "x"}], "criterion 1"),
        ([{"title": "A", "wieght": 2}], "unknown keys"),
        ([{"title": "A", "weight": -1}], "positive"),
    ]:
        with pytest.raises(ValueError, match=match):
            parse_rubric(bad)


def test_question_text_and_fill():
    chatml = "<|im_start|>system\nBe brief<|im_end|>\n<|im_start|>user\n7+5=<|im_end|>\n<|im_start|>assistant\n"
    assert question_text(chatml) == "7+5="
    assert question_text("7+5=") == "7+5="
    assert (
        question_text(
            [
                {"role": "user", "content": "hi"},
                {"role": "assistant", "content": "yo"},
                {"role": "user", "content": "7+5="},
            ]
        )
        == "7+5="
    )
    with pytest.raises(ValueError, match="user turn"):
        question_text([{"role": "system", "content": "x"}])
    # plain replacement: braces inside the texts survive (str.format would raise)
    text = fill(PAIRWISE_PROMPT, question="f({x})", answer_a="{answer_b}", answer_b="2")
    assert "[Question]\nf({x})\n" in text and "[Answer of assistant A]\n{answer_b}\n" in text
    assert text.endswith("[Answer of assistant B]\n2") and "[[A]]" in text and "[[C]]" in text


# ----------------------------------------------------------------------------- real classes, scripted judges


@pytest.fixture(scope="module")
def tok():
    return build_char_tokenizer()


@pytest.fixture(scope="module")
def random_model(tok):
    return load_model("builtin:tiny", tok, seed=0, model_args=ONE_LAYER_ARGS).eval()


def scripted(judge, rule):
    """Replace the judge's generator by `rule(prompt_text) -> judgement`; record what it was asked."""
    asked = []

    def generate(texts):
        asked.extend(texts)
        return [rule(t) for t in texts]

    judge.generate = generate
    return asked


def answer(text, which):
    return text.split(f"[Answer of assistant {which}]\n")[1].split("\n")[0]


def test_pairwise_judge_fair_and_position_biased(tok, random_model):
    judge = PairwiseJudge(random_model, tok)
    # a fair judge that prefers the answer "12": wins in both orders, and ties when neither is "12"
    asked = scripted(
        judge, lambda t: "[[A]]" if answer(t, "A") == "12" else ("[[B]]" if answer(t, "B") == "12" else "[[C]]")
    )
    verdicts = judge.judge(["7+5=", "7+5=", "2+2="], ["12", "13", "5"], ["13", "12", "3"])
    assert verdicts == ["A", "B", "tie"]
    assert len(asked) == 6 and answer(asked[0], "A") == "12" and answer(asked[3], "A") == "13"  # swapped order
    assert judge.last_stats["inconsistent"] == 0 and judge.last_stats["tie_frac"] == pytest.approx(1 / 3)
    # a judge that always picks the first answer: every pair disagrees across orders -> all ties
    scripted(judge, lambda t: "[[A]]")
    assert judge.judge(["7+5=", "2+2="], ["12", "4"], ["13", "5"]) == ["tie", "tie"]
    assert judge.last_stats["inconsistent"] == 2 and judge.failures == 0
    # without swapping the same biased judge would call them wins
    judge.swap = False
    assert judge.judge(["7+5="], ["13"], ["12"]) == ["A"]


def test_pairwise_parse_failures_counted_per_judgement_and_pair(tok, random_model):
    judge = PairwiseJudge(random_model, tok)
    # pair 1: (a,b) parsed, (b,a) not -> None; pair 2: both fine -> A
    replies = iter(["[[A]]", "[[A]]", "garbage", "[[B]]"])
    scripted(judge, lambda t: next(replies))
    assert judge.judge(["1+1=", "2+2="], ["2", "4"], ["3", "5"]) == [None, "A"]
    assert judge.last_stats["parse_failures"] == 1 and judge.last_stats["failures"] == 1
    assert judge.last_stats["parse_fail_frac"] == pytest.approx(0.25)
    assert (judge.parse_failures, judge.failures) == (1, 1)
    with pytest.raises(ValueError, match="one answer of each"):
        judge.judge(["1+1="], ["2"], [])
    with pytest.raises(ValueError, match=r"\{answer_b\}"):
        PairwiseJudge(random_model, tok, prompt="{question} {answer_a}")


def test_rubric_judge_scores_by_hand(tok, random_model):
    rubric = RubricJudge(
        random_model, tok, [{"title": "Correct", "weight": 3}, "Concise", {"title": "Rambles", "weight": -1}]
    )
    replies = iter(
        [
            "ok [[1: 10]] [[2: 5]] [[3: 0]]",  # (3·1 + 1·.5 - 0) / 4 = 0.875
            "[[2: 10]] [[3: 10]]",  # criterion 1 missing: (1·1 - 1·1) / 1 = 0
            "[[3: 10]]",  # only the pitfall: no positive weight parsed -> fallback 0.0, failure
            "nothing",
        ]
    )  # -> fallback
    asked = scripted(rubric, lambda t: next(replies))
    scores = rubric(["7+5="] * 4, ["12", "12!", "twelve", "?"])
    assert scores == pytest.approx([0.875, 0.0, 0.0, 0.0], abs=1e-12)
    assert rubric.last_stats == {"parse_failures": 2.0, "parse_fail_frac": 0.5, "missing_criteria": 1 + 2 + 3}
    assert "1. Correct\n2. Concise\n3. Rambles (pitfall)" in asked[0] and "from 0 (not met at all) to 10" in asked[0]
    assert "[Question]\n7+5=\n\n[Answer]\n12\n" in asked[0]


def test_rubric_from_the_rubric_column(tok, random_model):
    rubric = RubricJudge(random_model, tok, max_score=4, fallback=-1.0)
    scripted(rubric, lambda t: "[[1: 3]] [[2: 1]]")
    # sample 1: weights (1, 1): (.75 + .25) / 2 = 0.5; sample 2: one criterion of weight 2: 2·.75 / 2 = .75
    scores = rubric(["a", "b"], ["x", "y"], rubric=[["P", "Q"], '[{"title": "R", "weight": 2}]'])
    assert scores == pytest.approx([0.5, 0.75], abs=1e-12)
    with pytest.raises(MissingColumnError, match="rubric"):
        rubric(["a"], ["x"])  # no criteria and no rubric column


def test_random_builtin_judge_fails_to_parse_and_is_counted_not_fatal(tok, random_model):
    # a random tiny model writes garbage: no [[X]] tag, every verdict None, counted, nothing raised
    judge = PairwiseJudge(random_model, tok, max_new_tokens=8)
    verdicts = judge.judge(["7+5=", "1+1="], ["12", "2"], ["13", "3"])
    assert len(judge.last_judgements) == 4
    expected = [
        combine_verdicts(parse_verdict(x), parse_verdict(y))
        for x, y in zip(judge.last_judgements[:2], judge.last_judgements[2:])
    ]
    assert verdicts == expected == [None, None]
    assert judge.parse_failures == 4 and judge.failures == 2
    # greedy (temperature 0): judging again gives the same texts
    first = list(judge.last_judgements)
    judge.judge(["7+5=", "1+1="], ["12", "2"], ["13", "3"])
    assert judge.last_judgements == first and judge.failures == 4


def test_registered_judge_and_rubric_rewards_through_reward_set():
    assert {"judge", "rubric"} <= set(REWARDS)
    model_args = {"model": "builtin:tiny", "max_new_tokens": 4, "precision": "fp32"}
    rs = RewardSet(
        ["judge", "rubric"],
        reward_kwargs={
            "judge": {**model_args, "fallback": 0.25},
            "rubric": {**model_args, "criteria": ["Correct"], "fallback": -1.0},
        },
    )
    result = rs.compute(["7+5=", "1+1="], ["12", "2"], chosen=["12", "2"])
    # random judges: every verdict and grade fails -> the fallbacks, failures logged as rewards/<name>/...
    assert result.components["judge"].tolist() == [0.25, 0.25]
    assert result.components["rubric"].tolist() == [-1.0, -1.0]
    assert result.metrics["reward/judge/parse_failures"] == 4.0  # 2 pairs x 2 orders
    assert result.metrics["reward/rubric/parse_failures"] == 2.0
    with pytest.raises(ValueError, match="Bad options for reward 'judge'"):
        make_reward("judge", model="builtin:tiny", refrence="chosen")


def test_judge_reward_maps_verdicts():
    fn = make_reward("judge", model="builtin:tiny", reference="answer", max_new_tokens=2, precision="fp32")
    # completion is answer a, the reference answer b: win 1, tie 0.5, loss 0
    scripted(fn.pairwise, lambda t: "[[A]]" if answer(t, "A") == "12" else "[[B]]")
    assert fn(["7+5="] * 2, ["12", "13"], answer=["13", "12"]) == [1.0, 0.0]
    scripted(fn.pairwise, lambda t: "[[C]]")
    assert fn(["7+5="], ["12"], answer=["13"]) == [0.5]
