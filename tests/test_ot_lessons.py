"""The OT lessons of the core path (chapters 05-08) as lessons: every exported line is shown, the
prose keeps to its budget, and the claim that Sinkhorn crawls on staged costs holds."""

import json
import re
import warnings
from pathlib import Path

import pytest
import torch

from hara_ref.ot.entropic import semidual_reference, sinkhorn_reference
from hara_ref.rlvr.data import planted_stage_rollouts

OT = Path(__file__).resolve().parents[1] / 'nbs' / '2_ot'
BUDGET = {'05_sinkhorn': 1300, '06_fgw': 1050, '07_fgw_barycenter': 950, '08_linearization': 1450}


def cells(name):
    return json.loads((OT / f'{name}.ipynb').read_text())['cells']


@pytest.mark.parametrize('name', BUDGET)
def test_the_lesson_shows_every_exported_line(name):
    hidden = [
        c['id']
        for c in cells(name)
        if c['cell_type'] == 'code'
        and re.search(r'^#\| export', ''.join(c['source']), re.M)
        and re.search(r'^#\| hide', ''.join(c['source']), re.M)
    ]
    assert hidden == [], f'{name}: exported code in hidden cells {hidden}'


@pytest.mark.parametrize('name', BUDGET)
def test_the_lesson_keeps_to_its_prose_budget(name):
    text = ''.join(''.join(c['source']) for c in cells(name) if c['cell_type'] == 'markdown')
    words = len(re.findall(r"[A-Za-z0-9][\w'’-]*", text))  # the project's word count
    assert words <= BUDGET[name], f'{name}: {words} words'


def test_sinkhorn_crawls_on_a_staged_cost_where_newton_does_not():
    "Chapter 05's claim: stages make Sinkhorn crawl, not Newton; Gaussian features do not."
    pr = planted_stage_rollouts(K=1, stage_len=(6, 10), seed=0)
    h_st = pr.hidden[0][pr.mask[0]]  # (L, d)
    L, L_b = len(h_st), 16
    h_gs = torch.randn(h_st.shape, generator=torch.Generator().manual_seed(0), dtype=torch.float64)
    tau, tau_bar = (torch.linspace(0, 1, n, dtype=torch.float64) for n in (L, L_b))
    a = torch.full((L,), 1 / L, dtype=torch.float64)
    b = torch.full((L_b,), 1 / L_b, dtype=torch.float64)
    runs = {}
    for name, h in (('staged', h_st), ('gauss', h_gs)):
        h = h / h.norm(dim=-1, keepdim=True)
        z = h[(tau_bar * (L - 1)).round().long()]  # (L_b, d)
        M = 0.75 * torch.cdist(h, z) ** 2 + 0.5 * (tau[:, None] - tau_bar) ** 2  # (L, L_b)
        with warnings.catch_warnings():
            warnings.simplefilter('error')  # Newton converges without a warning
            _, nt = semidual_reference(a, b, M, 0.05, log=True)
        _, sk = sinkhorn_reference(a, b, M, 0.05, num_iter_max=5000, log=True, warn=False)
        runs[name] = sk, nt
    (sk_st, nt_st), (sk_gs, nt_gs) = runs['staged'], runs['gauss']
    assert not sk_st['converged'] and sk_st['n_iter'] == 5000
    assert sk_gs['converged'] and sk_gs['n_iter'] < 1000
    assert nt_st['converged'] and nt_gs['converged'] and max(nt_st['n_iter'], nt_gs['n_iter']) < 20
