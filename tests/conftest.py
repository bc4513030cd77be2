"Shared test set-up."

import pytest
import torch


@pytest.fixture(autouse=True)
def _restore_process_state():
    """The training CLI sets torch threads and flushes denormals for its workers; undo both so every
    later test sees a normal process."""
    n = torch.get_num_threads()
    yield
    torch.set_flush_denormal(False)
    torch.set_num_threads(n)


def pytest_collection_modifyitems(items):
    """Tests named for float32 join the `float32` set (as do those marked by hand): make test reruns
    it on other kernels."""
    for item in items:
        if 'float32' in item.name:
            item.add_marker(pytest.mark.float32)
