"""Samples as the report and the dashboard show them: training and held-out rows apart, chat markup as text."""

from __future__ import annotations

from lmrl.report.runs import load_run
from lmrl.report.samples import chat_text, sample_tables

CHATML_PROMPT = "<|im_start|>user\n2-2=<|im_end|>\n<|im_start|>assistant\n"


def test_chatml_is_shown_as_one_role_line_per_message_without_the_generation_prompt():
    assert chat_text(CHATML_PROMPT) == "user: 2-2="
    system = "<|im_start|>system\nBe brief.\nReally.<|im_end|>\n" + CHATML_PROMPT
    assert chat_text(system) == "system: Be brief.\\nReally.\nuser: 2-2="  # a message's own newline as \n


def test_a_prompt_cut_inside_a_tag_reads_from_its_first_whole_message():
    """samples.jsonl keeps a single-turn RL prompt's last 60 characters."""
    assert chat_text(CHATML_PROMPT[5:]) == "…user: 2-2="  # 'tart|>user\n...'
    assert chat_text("d|>\n" + CHATML_PROMPT) == "…user: 2-2="  # the end of <|im_end|>


def test_a_multi_turn_transcript_and_other_templates():
    transcript = "[calculator(expression='47*83')]<|im_end|>\n<|im_start|>tool\n3901<|im_end|>\n"
    assert chat_text(transcript) == "[calculator(expression='47*83')]\ntool: 3901"
    llama3 = (
        "<|begin_of_text|><|start_header_id|>user<|end_header_id|>\n\n3+4=<|eot_id|>"
        "<|start_header_id|>assistant<|end_header_id|>\n\n"
    )
    assert chat_text(llama3) == "user: 3+4="
    assert chat_text("<start_of_turn>user\nhey<end_of_turn>\n<start_of_turn>model\n") == "user: hey"


def test_text_without_markup_is_one_line_with_its_whitespace_visible():
    assert chat_text("46") == "46" and chat_text("\n\n") == "\\n\\n" and chat_text("") == ""


def test_a_real_rl_runs_training_and_held_out_samples_are_apart(real_rl_run):
    """The 3-step GRPO run samples for training at step 1 and evaluates at steps 0, 2 and 3 (eval_every=2, last)."""
    tables = sample_tables(load_run(real_rl_run).samples, newest=30)
    training, held_out = tables["training"], tables["held_out"]
    assert {r["step"] for r in training["rows"]} == {1} and {r["step"] for r in held_out["rows"]} == {0, 2, 3}
    assert "reward" in training["cols"] and "score" not in training["cols"]
    assert {"answer", "score"} <= set(held_out["cols"]) and "reward" not in held_out["cols"]
    prompts = [r["prompt"] for r in training["rows"]]
    assert all(p.startswith("user: ") and "<|im" not in p for p in prompts), prompts
    assert len(sample_tables(load_run(real_rl_run).samples, newest=2)["held_out"]["rows"]) == 2  # the newest
