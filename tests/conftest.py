"""Fixtures any test may ask for (plain helpers are in tests/helpers.py)."""

import pytest


@pytest.fixture
def one_thread():
    """One intra-op thread during the test: on a shared 2-core machine tiny models run several times faster on one
    uncontended thread than on two."""
    import torch

    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)
