"""Module train/eval modes, changed for a block and put back exactly, module by module.

``model.train(was_training)`` is not a restore: it sets every submodule to the root's flag, and the root's flag of a
peft wrapper or an RL policy need not say what its layers were (a peft wrapper is created in training mode around
a base loaded in eval mode). Putting back each module's own flag leaves dropout as the caller had it.
"""

from __future__ import annotations

import contextlib

import torch

__all__ = ["evaluating"]


@contextlib.contextmanager
def evaluating(model: torch.nn.Module):
    """Every module of ``model`` in eval mode within the block; each module's own mode after it."""
    modes = [(module, module.training) for module in model.modules()]
    model.eval()
    try:
        yield model
    finally:
        for module, training in modes:
            module.training = training
