"""What the vLLM engine pushes into its running model: the training model's weights under checkpoint names.

The push itself is vLLM's in-place reload (`collective_rpc("reload_weights", weights_iterator=..., is_checkpoint_format=
True)`, vLLM >= 0.32, the model-runner API that GPU and CPU builds share); this module only names the tensors:

- a plain HF causal LM: its parameters as `save_pretrained` names them (a tied LM head once, as the embedding);
- a PEFT (LoRA) model: the adapters merged into the base weights for the push (`merge_adapter()` /
  `unmerge_adapter()`, as TRL's colocate mode does), LoRA factors skipped, `base_layer` / `modules_to_save`
  renamed back to the base model's names;
- then transformers' own reverse of its load-time conversions (`revert_weight_conversion`, what `save_pretrained`
  does): transformers 5 keeps some models' weights fused in memory (MoE experts as `mlp.experts.gate_up_proj` of shape
  (E, 2I, H)), while vLLM's loaders take the checkpoint's per-expert names (Mixtral: `block_sparse_moe.experts.N.w1`);
- under torch.distributed: the class torchrun's wrappers made (`FSDPQwen2ForCausalLM`, `DDPQwen2ForCausalLM`) is
  not the architecture (`architecture`), and a sharded parameter (DTensor) is gathered whole.

Two functions run inside vLLM's worker (`llm.collective_rpc(fn)`), on the CPU backend only, because its kernels keep
prepacked copies that an in-place reload does not refresh (shared/notes/vllm-cpu.md):
- `repack_tied_head`: a tied LM head keeps its own prepacked copy of the embedding (measured: log-prob gap 1.99);
- `install_moe_repack`: the CPU MoE experts are prepacked at load time only; after a reload they would run on raw
  weights (gap 1.7-6.2 on a tiny Qwen3-MoE). Installed once, it packs each MoE layer exactly once per reload that
  loaded it, inside vLLM's own per-layer processing.
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


def architecture(model) -> str:
    """The HF class name of `model` (the PEFT base model's), under any torch.distributed wrapper: FSDP2's
    `fully_shard` and the composable `replicate` (DDP) give the module a new class, `FSDP<cls>` / `DDP<cls>`, whose
    name no vLLM registers."""
    hf = model.get_base_model() if is_peft_model(model) else model
    wrappers = distributed_wrappers()
    return next(cls for cls in type(hf).__mro__ if not issubclass(cls, wrappers)).__name__


def distributed_wrappers() -> tuple[type, ...]:
    """The classes torch.distributed mixes into a module it wraps in place."""
    from torch.distributed.fsdp import FSDPModule

    try:
        from torch.distributed._composable.replicate import DDP
    except ImportError:  # pragma: no cover - a torch without the composable replicate
        return (FSDPModule,)
    return FSDPModule, DDP


def hf_weights(model, dtype: torch.dtype | None = None) -> Iterator[tuple[str, torch.Tensor]]:
    """(checkpoint name, detached tensor) for every base weight of `model`, cast to `dtype` one tensor at a time.

    Names are the checkpoint's (`save_pretrained`'s): PEFT names mapped back, then transformers' in-memory fusions
    reverted (per-expert MoE weights are views of the fused tensors, no copy). A sharded (DTensor) parameter is
    gathered whole: a collective, so every rank iterates. For a PEFT model call it inside `merged_adapters(model)`,
    so the base weights hold W + BA."""
    peft = is_peft_model(model)
    state = {}
    for name, param in model.named_parameters():
        target = checkpoint_name(name, peft)
        if target is not None:
            tensor = param.detach()
            state[target] = tensor.full_tensor() if hasattr(tensor, "full_tensor") else tensor
    for name, tensor in checkpoint_names(model.get_base_model() if peft else model, state).items():
        yield name, tensor if dtype is None or tensor.dtype == dtype else tensor.to(dtype)


def checkpoint_names(hf_model, state: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """`state` (in-memory names) under the names a checkpoint of `hf_model` has: transformers'
    `revert_weight_conversion` (the same dict back when the model has no conversion, e.g. Llama, Qwen2)."""
    try:
        from transformers.core_model_loading import revert_weight_conversion
    except ImportError:  # transformers < 5: in-memory names are checkpoint names
        return state
    return dict(revert_weight_conversion(hf_model, state))


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


def install_moe_repack(worker) -> int:
    """vLLM worker function (`llm.collective_rpc(install_moe_repack)`, once after start): on the CPU backend, make
    every unquantized MoE layer re-pack its experts after each in-place reload that loads it. Returns how many layers
    (0 on other platforms, or without MoE).

    vLLM's layerwise reload runs `quant_method.process_weights_after_loading(layer)` once per layer whose weights
    arrived (never for a layer the reload did not touch), then copies the result into the running kernel's tensors. On
    a reload that method sees the kernel already built and skips the CPU experts' prepack (padding and
    `cpu_prepack_moe_weight`), so the kernel would run on raw weights. The wrapper adds that prepack right there:
    exactly once per loaded layer, on the freshly loaded raw weights, so nothing is ever packed twice."""
    from vllm.platforms import current_platform

    if not current_platform.is_cpu():
        return 0
    from vllm.model_executor.layers.fused_moe.experts.cpu_moe import CPUUnquantizedExperts

    count = 0
    for module in worker.model_runner.get_model().modules():
        method = getattr(module, "quant_method", None)
        experts = getattr(getattr(method, "moe_kernel", None), "fused_experts", None)
        if not isinstance(experts, CPUUnquantizedExperts):
            continue
        if not getattr(method, "lmrl_repacks", False):
            method.process_weights_after_loading = _repacking(method.process_weights_after_loading, experts)
            method.lmrl_repacks = True
        count += 1
    return count


def _repacking(process, experts):
    def process_and_repack(layer) -> None:
        process(layer)  # the kernel exists: vLLM's reload path, which leaves the experts unpacked
        experts.process_weights_after_loading(layer)  # pad + cpu_prepack_moe_weight, as at load time

    return process_and_repack
