"""Models: load HF causal LMs or build built-in tiny ones; dtype policy; log-probs."""

from lmrl.models.loading import (
    BUILTIN_MODELS,
    count_parameters,
    describe_parameters,
    is_builtin,
    load_model,
    load_model_and_tokenizer,
    save_model,
)
from lmrl.models.precision import autocast, autocast_dtype, bf16_supported

__all__ = [
    "BUILTIN_MODELS",
    "autocast",
    "autocast_dtype",
    "bf16_supported",
    "count_parameters",
    "describe_parameters",
    "is_builtin",
    "load_model",
    "load_model_and_tokenizer",
    "save_model",
]
