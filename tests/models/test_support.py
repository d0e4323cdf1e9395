"""Start-up refusals of models lmrl cannot train: one line naming the model and the fix."""

import pytest
import torch
from transformers import BertConfig, BertLMHeadModel, T5Config, T5ForConditionalGeneration

from lmrl.models.support import check_causal_lm


def test_an_encoder_loaded_as_a_causal_lm_is_refused():
    bert = BertLMHeadModel(
        BertConfig(vocab_size=50, hidden_size=16, num_hidden_layers=1, num_attention_heads=2, intermediate_size=16)
    )  # is_decoder=False: attends both ways
    with pytest.raises(ValueError, match=r"'my-bert' \(bert\) is not a causal LM") as info:
        check_causal_lm(bert, "my-bert")
    assert len(str(info.value).splitlines()) == 1 and "decoder-only causal LMs" in str(info.value)
    bert.config.is_decoder = True  # a BERT made causal passes
    for layer in bert.bert.encoder.layer:
        layer.attention.self.is_causal = True
    check_causal_lm(bert, "my-bert")


def test_encoder_decoder_models_and_broken_forwards_are_refused():
    t5 = T5ForConditionalGeneration(T5Config(vocab_size=50, d_model=16, d_ff=16, num_layers=1, num_heads=2, d_kv=8))
    with pytest.raises(ValueError, match=r"'t5' \(t5\) is an encoder-decoder model"):
        check_causal_lm(t5, "t5")

    class Broken(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.embed = torch.nn.Embedding(10, 4)

        def get_input_embeddings(self):
            return self.embed

        def forward(self, input_ids):
            raise RuntimeError("shape mismatch\nmore detail")

    with pytest.raises(ValueError, match=r"failed a 5-token forward \(RuntimeError: shape mismatch\)"):
        check_causal_lm(Broken(), "broken")
