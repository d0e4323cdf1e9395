"""What the vLLM engine pushes into its running model: the training model's weights under checkpoint names.

The push itself is vLLM's in-place reload (`collective_rpc("reload_weights", weights_iterator=..., is_checkpoint_format=
True)`, vLLM >= 0.32, the model-runner API that GPU and CPU builds share); this module only names the tensors:

- a plain HF causal LM: its parameters as `save_pretrained` names them (a tied LM head once, as the embedding);
- a PEFT (LoRA) model: the adapters merged into the base weights for the push (`merge_adapter()` /
  `unmerge_adapter()`, as TRL's colocate mode does), LoRA factors skipped, `base_layer` / `modules_to_save`
  renamed back to the base model's names.

`repack_tied_head` runs inside vLLM's worker: on the CPU backend a tied LM head keeps its own prepacked copy of the
embedding, which the reload does not refresh (measured: log-prob gap 1.99 until repacked; shared/notes/vllm-cpu.md).
"""

from __future__ import annotations

import contextlib
import re
from collections.abc import Iterator

import torch

_ADAPTER_PARTS = re.compile(r"\.(lora_[A-Za-z_]+|original_module)\.")
_SAVED_COPY = re.compile(r"\.modules_to_save\.[^.]+\.")


def is_peft_model(model) -> bool:
    """True for a peft `PeftModel` (it has `merge_adapter` and wraps the HF model in `base_model.model`)."""
    return hasattr(model, "merge_adapter") and hasattr(model, "unmerge_adapter") and hasattr(model, "base_model")


def adapts_tied_head(model) -> bool:
    """True when a PEFT model's LoRA adapts an LM head tied to the input embedding: vLLM ties the two, so the merged
    head W + BA would also become the embedding and the engine would not sample the learner's policy."""
    if not is_peft_model(model):
        return False
    base = model.get_base_model()
    return bool(getattr(base.config, "tie_word_embeddings", False)) and hasattr(base.get_output_embeddings(), "lora_A")


def checkpoint_name(name: str, peft: bool) -> str | None:
    """The HF checkpoint name of parameter `name`, or None for a tensor that is not a base weight (LoRA factors, the
    frozen original of a `modules_to_save` copy)."""
    if not peft:
        return name
    if _ADAPTER_PARTS.search(name):
        return None
    name = name.removeprefix("base_model.model.").replace(".base_layer.", ".")
    return _SAVED_COPY.sub(".", name)


@contextlib.contextmanager
def merged_adapters(model):
    """Within: a PEFT model's adapters are merged into its base weights (undone after; no-op for plain models)."""
    if not is_peft_model(model):
        yield
        return
    model.merge_adapter()
    try:
        yield
    finally:
        model.unmerge_adapter()


def hf_weights(model, dtype: torch.dtype | None = None) -> Iterator[tuple[str, torch.Tensor]]:
    """(checkpoint name, detached tensor) for every base weight of `model`, cast to `dtype` one tensor at a time.

    For a PEFT model call it inside `merged_adapters(model)`, so the base weights hold W + BA."""
    peft = is_peft_model(model)
    for name, param in model.named_parameters():
        target = checkpoint_name(name, peft)
        if target is not None:
            tensor = param.detach()
            yield target, tensor if dtype is None or tensor.dtype == dtype else tensor.to(dtype)


def repack_tied_head(worker) -> int:
    """vLLM worker function (`llm.collective_rpc(repack_tied_head)`): on the CPU backend, re-pack every LM head from
    its current weight. Returns how many were re-packed (0 on other platforms, where no copy is kept)."""
    from vllm.model_executor.layers.utils import dispatch_cpu_unquantized_gemm
    from vllm.model_executor.layers.vocab_parallel_embedding import ParallelLMHead
    from vllm.platforms import current_platform

    if not current_platform.is_cpu():
        return 0
    count = 0
    for module in worker.model_runner.get_model().modules():
        if isinstance(module, ParallelLMHead) and hasattr(module, "cpu_linear") and module.weight.numel() > 0:
            dispatch_cpu_unquantized_gemm(module, remove_weight=False)
            count += 1
    return count
