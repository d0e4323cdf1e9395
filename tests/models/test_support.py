"""Start-up refusals of models lmrl cannot train: one line naming the model and the fix."""

import pytest
import torch
from transformers import BertConfig, BertLMHeadModel, T5Config, T5ForConditionalGeneration

from lmrl.models.support import check_causal_lm
from tests.rounding import add_rounding_noise

pytestmark = pytest.mark.portable  # `make test-portable`: again under other CPU kernels and threads


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


def bert(causal: bool) -> BertLMHeadModel:
    model = BertLMHeadModel(
        BertConfig(vocab_size=50, hidden_size=16, num_hidden_layers=1, num_attention_heads=2, intermediate_size=16)
    )
    model.config.is_decoder = causal
    for layer in model.bert.encoder.layer:
        layer.attention.self.is_causal = causal
    return model


def test_a_causal_model_whose_logits_differ_by_rounding_is_accepted_and_a_bidirectional_one_still_refused():
    """Another CPU's kernels: logits at identical positions differ by rounding from forward to forward (2.0e-4 for
    SmolLM2 on a 2-core AMD EPYC). Scaled to logits of ~25, the noise here is ~2.5e-4: the check measures it."""
    for causal in (True, False):
        model = bert(causal)
        with torch.no_grad():
            model.cls.predictions.decoder.weight.mul_(50)  # logits of SmolLM2's scale
        add_rounding_noise(model.cls.predictions.decoder)
        if causal:
            check_causal_lm(model, "noisy-causal")
        else:
            with pytest.raises(ValueError, match=r"is not a causal LM: .*\(differs by .*, rounding allows .*\)"):
                check_causal_lm(model, "noisy-bert")


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
