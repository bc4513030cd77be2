"Shared test set-up."

import os

import pytest
from hypothesis import settings

# property tests draw the same examples on every run and machine, so a red CI is a regression;
# HYPOTHESIS_PROFILE=explore draws fresh examples (failures kept in .hypothesis/) to search wider
settings.register_profile('repeatable', derandomize=True)
settings.register_profile('explore', derandomize=False)
settings.load_profile(os.environ.get('HYPOTHESIS_PROFILE', 'repeatable'))


# the OT and HARA solvers' tests: their answers go through MKL's products and solves and ATen's
# kernels, so make test reruns them on other code paths (another CPU takes another path)
NUMERICAL = {
    'test_sinkhorn', 'test_newton', 'test_fgw', 'test_fgw_barycenter', 'test_linearization',
    'test_error_bound', 'test_exact', 'test_hara', 'test_hara_novelty', 'test_group_reference',
    'test_caps', 'test_ot_checks',
}  # fmt: skip


def pytest_collection_modifyitems(items):
    """Tests named for float32 join the `float32` set (as do those marked by hand), the solvers'
    tests the `numerical` set: make test reruns both on other kernels."""
    for item in items:
        if 'float32' in item.name:
            item.add_marker(pytest.mark.float32)
        if item.module.__name__.rsplit('.', 1)[-1] in NUMERICAL:
            item.add_marker(pytest.mark.numerical)


# the flags of a tiny `hara-ref train` / `hara-ref compare` run, in this order ('G' is -G; None: the
# flag is left out, the command's default holds)
TINY_RUN = dict(
    sft_steps=5,  # a tiny policy warm-started on the built-in task ...
    hidden_size=32,
    max_value=9,
    steps=2,  # ... trained for a few short steps ...
    seeds=1,
    G=None,  # -G: each file sets its own, or leaves the command's default
    prompts_per_step=3,
    max_new_tokens=8,
    eval_every=1,  # ... evaluated after each on 2 prompts x 2 samples ...
    eval_prompts=2,
    eval_samples=2,
    workers=1,  # ... in one worker on one thread
    threads=1,
)


@pytest.fixture
def tiny_flags():
    """`tiny_flags(**changes)`: the command-line flags of `TINY_RUN` with `changes` (a value of None
    leaves that flag out)."""

    def flags(**changes) -> list:
        unknown = set(changes) - set(TINY_RUN)
        if unknown:
            raise TypeError(f"not a tiny-run flag: {sorted(unknown)}")
        out = []
        for k, v in (TINY_RUN | changes).items():
            if v is not None:
                out += ['-G' if k == 'G' else '--' + k.replace('_', '-'), str(v)]
        return out

    return flags


@pytest.fixture
def one_thread():
    "One torch thread for the test (the solvers' tests compare answers, not speed)."
    import torch

    n = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(n)
