"""What differs between transformers versions in the calls lmrl makes, decided from the model, never assumed.

transformers 5.2x renamed the KV-cache keyword of every model ``forward`` from ``past_key_values`` to ``cache`` (and
the output field with it; the old name is removed in 5.40). A model that is asked for its cache under a name its
``forward`` does not take silently drops it, so lmrl reads the name off the signature once per call site.
"""

from __future__ import annotations

import inspect

__all__ = ["accepts_kwarg", "cache_kwarg", "new_dynamic_cache", "no_cache", "output_cache"]

CACHE_KWARGS = ("cache", "past_key_values")  # newest first


def accepts_kwarg(model, name: str) -> bool:
    """Whether model.forward (or the base model's, for PEFT wrappers and `BaseModelView`) names the keyword ``name``."""
    for candidate in (model, getattr(model, "get_base_model", lambda: None)()):
        if candidate is None:
            continue
        try:
            if name in inspect.signature(candidate.forward).parameters:
                return True
        except (TypeError, ValueError):
            continue
    return False


def cache_kwarg(model) -> str | None:
    """The keyword ``model.forward`` takes its KV cache by ("cache" or "past_key_values"); None if it takes none."""
    return next((name for name in CACHE_KWARGS if accepts_kwarg(model, name)), None)


def no_cache(model) -> dict[str, bool]:
    """``{"use_cache": False}`` for a forward that takes it: a training forward then builds no KV cache that nobody
    reads (GPT-2 and most HF models build one by default, as large as the keys and values of every layer)."""
    return {"use_cache": False} if accepts_kwarg(model, "use_cache") else {}


def output_cache(output):
    """The KV cache a forward returned (``output.cache``, or ``output.past_key_values`` before the rename)."""
    cache = getattr(output, "cache", None)
    return cache if cache is not None else getattr(output, "past_key_values", None)


def new_dynamic_cache(config):
    """An empty ``DynamicCache`` with the layer types of ``config`` (sliding-window layers where the model has them),
    as the model would build it; transformers without per-layer caches take no config."""
    from transformers.cache_utils import DynamicCache

    try:
        return DynamicCache(config=config)
    except TypeError:
        return DynamicCache()
