"""Fixtures of the engine tests (a test module may define its own of the same name)."""

import pytest
from vllm_helpers import char_prompts

from lmrl.data.tokenizers import build_char_tokenizer


@pytest.fixture(scope="module")
def tok():
    return build_char_tokenizer()


@pytest.fixture(scope="module")
def prompts(tok):
    return char_prompts(tok)
