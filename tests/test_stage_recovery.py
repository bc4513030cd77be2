"""The stage-recovery study of the exact FGW barycenter: node-to-stage mapping, held-out stage
recovery, look-alike stages (`hara_ref.methods.stage_recovery`)."""

import numpy as np
import pytest
import torch
from hara_ref.ot.fgw_barycenter import rollout_barycenter
from hara_ref.methods.stage_recovery import (
    stage_mapping,
    stage_recovery,
    heldout_recovery,
    lookalike_stage_rollouts,
)
from hara_ref.rlvr.data import planted_stage_rollouts


pytestmark = pytest.mark.usefixtures('one_thread')  # tests/conftest.py


def test_stage_mapping_and_recovery():
    pr = planted_stage_rollouts(K=6, seed=0, noise=0.15)
    Z, Cb, lg = rollout_barycenter(pr.hidden, pr.mask, L_b=12, max_iter=10)
    st_ = [pr.stages[i][pr.mask[i]] for i in range(6)]
    A = stage_mapping(lg['plans'], st_, 6)
    torch.testing.assert_close(A.sum(1), torch.ones(12, dtype=torch.float64))
    labels = A.argmax(1)
    # every stage, in order
    assert (labels.diff() >= 0).all() and labels.unique().tolist() == list(range(6))
    pur = stage_recovery(lg['plans'], st_, labels)
    assert 0.9 < pur <= 1 + 1e-12  # clean stages: nodes are nearly pure
    np.testing.assert_allclose(
        pur,
        float((torch.full((12,), 1 / 12, dtype=torch.float64) * A.max(1).values).sum()),
        atol=1e-12,
    )
    # same centres (same seed); rollouts 6.. are fresh
    test = planted_stage_rollouts(K=9, seed=0, noise=0.15)
    assert heldout_recovery(Z, Cb, labels, test.hidden[6:], test.mask[6:], test.stages[6:]) > 0.8


def _hsr(pr, K, alpha, K_test=8, L_b=12):
    """Held-out stage recovery of the notebook's study: barycenter on rollouts [:K], score rollouts
    [-K_test:]."""
    Z, Cb, lg = rollout_barycenter(pr.hidden[:K], pr.mask[:K], L_b=L_b, alpha=alpha, max_iter=20)
    labels = stage_mapping(lg['plans'], [pr.stages[i][pr.mask[i]] for i in range(K)], 6).argmax(1)
    return heldout_recovery(
        Z, Cb, labels, pr.hidden[-K_test:], pr.mask[-K_test:], pr.stages[-K_test:], alpha=alpha
    )


def test_fgw_beats_w_and_gw_on_lookalike_stages():
    """The notebook's study (same data: 24 rollouts, the last 8 held out) on two seeds: FGW > W and
    FGW > GW at K=8, and FGW's score rises from K=2 to K=8."""
    rise = []
    for seed in (0, 1):
        pr = lookalike_stage_rollouts(
            K=24, seed=seed, noise=0.5, p_skip=0.15, p_repeat=0.15, p_swap=0.15
        )
        sc = {al: _hsr(pr, 8, al) for al in (0.0, 0.25, 1.0)}
        assert sc[0.25] > sc[0.0] + 0.03 and sc[0.25] > sc[1.0] + 0.03, (seed, sc)
        rise.append(sc[0.25] - _hsr(pr, 2, 0.25))
    assert np.mean(rise) > 0, rise


def test_without_lookalikes_fgw_and_w_tie():
    """The mechanism: with well-separated stage centres (share=0) features suffice, and W is as good
    as FGW."""
    pr = lookalike_stage_rollouts(
        K=24, seed=0, share=0.0, noise=0.5, p_skip=0.15, p_repeat=0.15, p_swap=0.15
    )
    assert abs(_hsr(pr, 8, 0.25) - _hsr(pr, 8, 0.0)) < 0.03


def test_lookalike_stage_rollouts():
    la = lookalike_stage_rollouts(K=4, seed=2, noise=0.3, p_skip=0.2)
    pl = planted_stage_rollouts(K=4, seed=2, noise=0.3, p_skip=0.2)
    assert torch.equal(la.stages, pl.stages) and torch.equal(la.mask, pl.mask)
    torch.testing.assert_close(la.centers.norm(dim=-1), torch.ones(6, dtype=torch.float64))
    assert (
        float(la.centers[0] @ la.centers[5]) > 0.95 and float(la.centers[1] @ la.centers[4]) > 0.95
    )
    torch.testing.assert_close(
        la.hidden - la.centers[la.stages.clamp(min=0)] * la.mask[..., None],
        # same noise
        pl.hidden - pl.centers[pl.stages.clamp(min=0)] * pl.mask[..., None],
    )
    torch.testing.assert_close(
        lookalike_stage_rollouts(K=4, seed=2, noise=0.3, p_skip=0.2, share=0.0).hidden, pl.hidden
    )
    with pytest.raises(ValueError, match='share must be'):
        lookalike_stage_rollouts(share=-0.1)
    with pytest.raises(ValueError, match='pairs must be'):
        lookalike_stage_rollouts(pairs=((2, 2),))
