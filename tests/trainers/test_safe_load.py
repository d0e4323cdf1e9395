"""Checkpoints load without pickle: RNG state round-trips as plain data, and a pickled object is refused."""

import os
import random

import numpy as np
import pytest
import torch

from lmrl.trainers.common import rng_state, safe_load, set_rng_state


def test_rng_state_is_weights_only_loadable_and_exact(tmp_path):
    random.seed(1), np.random.seed(2), torch.manual_seed(3), np.random.normal()  # a cached gaussian too
    torch.save(rng_state(), tmp_path / "rng.pt")
    expected = (random.random(), np.random.normal(), torch.rand(1).item())
    set_rng_state(safe_load(tmp_path / "rng.pt"))
    assert (random.random(), np.random.normal(), torch.rand(1).item()) == expected


class Boom:
    def __reduce__(self):
        return (os.system, ("touch /tmp/lmrl-pwned-by-checkpoint",))


def test_a_pickled_object_is_refused_not_run(tmp_path):
    torch.save({"step": 1, "trainer": Boom()}, tmp_path / "trainer_state.pt")
    with pytest.raises(ValueError, match="cannot be loaded safely"):
        safe_load(tmp_path / "trainer_state.pt")
    assert not os.path.exists("/tmp/lmrl-pwned-by-checkpoint")


def test_an_old_numpy_rng_state_is_refused(tmp_path):
    torch.save({"numpy": np.random.get_state()}, tmp_path / "rng.pt")
    with pytest.raises(ValueError, match="model="):
        safe_load(tmp_path / "rng.pt")
