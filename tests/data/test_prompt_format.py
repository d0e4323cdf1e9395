"""One prompt encoder (`lmrl.data.prompt_format`): a base model's BOS reaches every path, raw prompts in RL, templates.

The tokenizer here is built locally as most base models' are (Llama, Gemma, Mistral): a byte-level BPE whose
post-processor adds a BOS, an EOS that is never appended, no pad token and no chat template.
"""

import pytest
import torch
from tokenizers import Tokenizer, decoders, models, pre_tokenizers, processors, trainers
from transformers import LlamaConfig, LlamaForCausalLM, PreTrainedTokenizerFast

from lmrl.config import load_config
from lmrl.data.prompt_format import PromptFormat
from lmrl.data.tokenizers import load_tokenizer
from lmrl.generate import run as generate
from lmrl.rollout.generate_config import GenerateConfig
from tests.helpers import RL_SMOKE

CORPUS = [f"{a}+{b}={a + b}. The capital of France is Paris." for a in range(30) for b in range(30)]


def base_tokenizer() -> PreTrainedTokenizerFast:
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=320, special_tokens=["<s>", "</s>"], initial_alphabet=pre_tokenizers.ByteLevel.alphabet()
    )
    tok.train_from_iterator(CORPUS, trainer)
    tok.post_processor = processors.TemplateProcessing(single="<s> $A", special_tokens=[("<s>", 0)])
    return PreTrainedTokenizerFast(tokenizer_object=tok, bos_token="<s>", eos_token="</s>")


@pytest.fixture(scope="module")
def base_model_dir(tmp_path_factory):
    """A random tiny Llama with the BOS-adding tokenizer and no chat template, saved as an HF folder."""
    path = tmp_path_factory.mktemp("base")
    tok = base_tokenizer()
    torch.manual_seed(0)
    config = LlamaConfig(
        vocab_size=len(tok),
        hidden_size=32,
        intermediate_size=64,
        num_hidden_layers=2,
        num_attention_heads=2,
        bos_token_id=0,
        eos_token_id=1,
        pad_token_id=None,
    )
    LlamaForCausalLM(config).save_pretrained(path)
    tok.save_pretrained(path)
    return path


def test_raw_prompts_carry_the_tokenizers_bos_and_no_eos():
    tok = base_tokenizer()
    text = "The capital of France is"
    ids = PromptFormat(chat=False).ids(tok, text)
    assert ids == tok(text)["input_ids"] and ids[0] == tok.bos_token_id and tok.eos_token_id not in ids
    templated = PromptFormat(chat=False, template="Q: {prompt}\nA:").ids(tok, "2+2=")
    assert templated == tok("Q: 2+2=\nA:")["input_ids"]
    with pytest.raises(ValueError, match=r"prompt_template must hold '\{prompt\}' exactly once"):
        PromptFormat(template="no placeholder")
    with pytest.raises(ValueError, match="chat=false prompts are plain text"):
        PromptFormat(chat=False).ids(tok, [{"role": "user", "content": "hi"}])


def test_the_chat_path_is_the_templates_own_tokens():
    tok = load_tokenizer("builtin:char")
    messages = [{"role": "user", "content": "2+2="}]
    expected = list(tok.apply_chat_template(messages, add_generation_prompt=True, return_dict=True)["input_ids"])
    assert PromptFormat().ids(tok, "2+2=") == expected


def test_a_base_model_without_a_template_gets_no_new_tokens_for_raw_prompts(base_model_dir, tmp_path):
    size = len(base_tokenizer())
    raw = load_tokenizer(str(base_model_dir), chat=False)
    assert len(raw) == size and not raw.chat_template and raw.pad_token == raw.eos_token  # pad: the EOS, no new id
    with pytest.warns(UserWarning, match=r"has no chat template: lmrl's ChatML adds <\|im_start\|> and <\|im_end\|>"):
        chat = load_tokenizer(str(base_model_dir), chat=True)
    assert len(chat) == size + 2
    template = tmp_path / "template.jinja"
    template.write_text("{{ bos_token }}{% for m in messages %}Q: {{ m['content'] }}\nA:{% endfor %}")
    own = load_tokenizer(str(base_model_dir), chat_template=str(template))
    assert len(own) == size and PromptFormat().ids(own, "2+2=") == own("Q: 2+2=\nA:")["input_ids"]
    with pytest.raises(ValueError, match="neither a file nor a Jinja template"):
        load_tokenizer(str(base_model_dir), chat_template="missing.jinja")


def test_lmrl_generate_chat_false_gives_transformers_greedy_tokens(base_model_dir):
    text = "The capital of France is"
    config = load_config(
        GenerateConfig,
        None,
        [f"model={base_model_dir}", f"prompts={[text]}", "chat=false", "temperature=0", "max_new_tokens=12"],
    )
    ours = generate(config)[0][0]
    tok = base_tokenizer()
    model = LlamaForCausalLM.from_pretrained(base_model_dir).eval()
    inputs = tok(text, return_tensors="pt")
    out = model.generate(**inputs, do_sample=False, max_new_tokens=12, pad_token_id=tok.eos_token_id)
    theirs = tok.decode(out[0, inputs["input_ids"].shape[1] :], skip_special_tokens=True)
    assert ours == theirs


def test_rl_trains_a_base_model_from_raw_prompts_with_its_bos_and_its_own_vocabulary(base_model_dir, tmp_path):
    from lmrl.rollout.samplers import groups
    from lmrl.trainers.rl import trainer as online

    seen = []
    real = groups.sample_shard

    def spy(engine, tokenizer, rows, options, generator, recorder=None):
        batch = real(engine, tokenizer, rows, options, generator, recorder)
        seen.append(batch.prompt_ids[batch.prompt_mask.bool()].tolist())
        return batch

    overrides = [
        f"model={base_model_dir}",
        "chat=false",
        'prompt_template="Q: {prompt}"',
        "max_steps=1",
        "precision=fp32",
        *RL_SMOKE,
        f"output_dir={tmp_path / 'grpo'}",
    ]
    config = load_config(online.RLConfig, None, overrides)
    groups.sample_shard, saved = spy, groups.sample_shard
    try:
        online.train(config)
    finally:
        groups.sample_shard = saved
    tok = base_tokenizer()
    assert seen and seen[0][0] == tok.bos_token_id  # the first prompt's first token: BOS
    final = LlamaForCausalLM.from_pretrained(tmp_path / "grpo" / "final")
    assert final.get_input_embeddings().num_embeddings == len(tok)  # no token added, the checkpoint's shape kept
    assert len(load_tokenizer(str(tmp_path / "grpo" / "final"), chat=False)) == len(tok)


def test_the_models_own_stop_tokens_end_a_completion_as_transformers_generate_does(base_model_dir):
    """generation_config.eos_token_id may be a list (Llama 3's <|eot_id|>, Gemma's <end_of_turn>): each ends it."""
    from lmrl.rollout import HFEngine, SamplingParams

    tok = base_tokenizer()
    model = LlamaForCausalLM.from_pretrained(base_model_dir).eval()
    ids = tok("The capital of France is")["input_ids"]
    params = SamplingParams(max_new_tokens=8, greedy=True)
    free = HFEngine(model, load_tokenizer(str(base_model_dir), chat=False)).generate([ids], params)
    third = free.completion_ids[0, 2].item()  # the greedy third token becomes a stop token of the model's own
    model.generation_config.eos_token_id = [tok.eos_token_id, third]
    stopped = HFEngine(model, load_tokenizer(str(base_model_dir), chat=False)).generate([ids], params)
    assert stopped.completion_mask[0].sum().item() == 3 and stopped.finish_reason == ["stop"]
    theirs = model.generate(torch.tensor([ids]), do_sample=False, max_new_tokens=8, pad_token_id=tok.eos_token_id)
    assert stopped.completion_ids[0, :3].tolist() == theirs[0, len(ids) :].tolist()


def test_lmrl_eval_chat_false_gives_transformers_greedy_tokens(base_model_dir, tmp_path):
    import json

    from lmrl.eval.cli import EvalConfig
    from lmrl.eval.cli import run as evaluate

    out = tmp_path / "eval.json"
    overrides = [f"model={base_model_dir}", "chat=false", "metrics=[accuracy]", "rows=3", "task_args.digits=1"]
    evaluate(load_config(EvalConfig, None, [*overrides, "max_new_tokens=8", f"output_file={out}", "precision=fp32"]))
    samples = json.loads(out.read_text())["samples"]
    assert samples and len(samples) <= 3
    tok = base_tokenizer()
    model = LlamaForCausalLM.from_pretrained(base_model_dir).eval()
    for sample in samples:
        inputs = tok(sample["prompt"], return_tensors="pt")
        out_ids = model.generate(**inputs, do_sample=False, max_new_tokens=8, pad_token_id=tok.eos_token_id)
        assert sample["completion"] == tok.decode(out_ids[0, inputs["input_ids"].shape[1] :], skip_special_tokens=True)
