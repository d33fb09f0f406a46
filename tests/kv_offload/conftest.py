import pytest
import torch


@pytest.fixture(scope="module")
def one_thread():
    """Tiny torch models: one intra-op thread. On a loaded 2-core machine two OpenMP threads make
    every small op wait for a time slice (~10 ms each); one thread is also faster for tiny shapes."""
    n = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(n)
