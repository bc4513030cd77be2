"""`hara-ref bench scale`, `bench hara`'s families and the FGW-batch table: FLOP counts
against the model's own parameters, the tables' arithmetic, and the GPU script's dry run on CPU."""

import json
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from hara_ref.bench.solvers import bench_fgw_batch
from hara_ref.bench.scale import layer_flops, qwen3_config, scale_row, step_flops
from hara_ref.practice.commands import bench_hara_cli, bench_scale_cli

ROOT = Path(__file__).resolve().parent.parent


@pytest.mark.parametrize('size', ['tiny', '0.6B'])
def test_layer_flops_count_the_layer_parameters(size):
    "At zero context a token's forward is 2 FLOPs per weight of the layer's linear maps."
    from transformers.models.qwen3.modeling_qwen3 import Qwen3DecoderLayer

    cfg = qwen3_config(size)
    with torch.device('meta'):
        layer = Qwen3DecoderLayer(cfg, 0)
    n = sum(m.weight.numel() for m in layer.modules() if isinstance(m, torch.nn.Linear))
    assert layer_flops(cfg, 0) == 2 * n


def test_published_sizes():
    "Non-embedding parameters of the published shapes: 0.44 B, 1.4 B, 3.6 B, 6.95 B."
    for size, published in (('0.6B', 0.44e9), ('1.7B', 1.4e9), ('4B', 3.6e9), ('8B', 6.95e9)):
        cfg = qwen3_config(size)
        n = cfg.num_hidden_layers * layer_flops(cfg, 0) / 2
        assert abs(n - published) < 0.03 * published, (size, n)


def test_attention_term_and_step():
    "Attention adds 4 h_q d_h FLOPs per key; the update is three scoring passes."
    cfg = qwen3_config('tiny')
    q = cfg.num_attention_heads * cfg.head_dim
    assert layer_flops(cfg, 10) - layer_flops(cfg, 0) == 4 * q * 10
    f = step_flops(cfg, 2, 3, 5)
    assert f['update'] == 3 * f['scoring']
    head = 2 * cfg.hidden_size * cfg.vocab_size
    # scoring: 2 sequences of 8 tokens through the layers, head on the 5 completion tokens each
    want = 2 * 8 * cfg.num_hidden_layers * layer_flops(cfg, 4.5) + 2 * 5 * head
    assert f['scoring'] == pytest.approx(want)


def test_scale_row_arithmetic():
    "Each phase takes FLOPs / its piece's rate; HARA scales by prompts; share and extra agree."
    pieces = {
        k: (1.0, 1e9)
        for k in ('forward', 'forward_backward', 'decode', 'head_forward', 'head_forward_backward')
    }
    hara = dict(t_hara=2.0, products=10.0, tokens=100, B=4, L_b=4, d=64, bary_iters=7, ratio=3.0)
    r = scale_row(
        'tiny', pieces, hara, prompts=4, rollouts=4, prompt_len=8, length=16, hara_prompts=1
    )
    F = step_flops(qwen3_config('tiny'), 16, 8, 16)
    assert r['time']['scoring'] == pytest.approx(F['scoring'] / 1e9)
    assert r['time']['hara'] == pytest.approx(8.0)
    model = r['time']['generation'] + r['time']['scoring'] + r['time']['update']
    assert r['share'] == pytest.approx(8.0 / (model + 8.0))
    assert r['extra'] == pytest.approx(8.0 / model)


def test_fgw_batch_table():
    "Three plans with their marginals, scored on one objective; the gap is to the best of them."
    r = bench_fgw_batch(32, K=2, L_b=4, d=8)
    assert set(r['fgw']) == {'linearized', 'pot_batch', 'pot_exact'}
    assert max(r['marginal_err'].values()) < 0.05
    assert r['gap'] >= 0
    assert r['gap'] == 0 or r['fgw']['linearized'] > min(r['fgw'].values())


def test_bench_scale_tiny(capsys):
    assert bench_scale_cli(['--tiny']) == 0
    out = capsys.readouterr().out
    assert 'Qwen3-tiny' in out and 'HARA share' in out


def test_gpu_script_dry_run(tmp_path):
    "tools/bench_gpu.sh, the GPU tables' command, runs end to end on CPU at a tiny size."
    res = subprocess.run(
        [
            'bash',
            str(ROOT / 'tools' / 'bench_gpu.sh'),
            '--device',
            'cpu',
            '--tiny',
            '--out',
            str(tmp_path),
        ],
        capture_output=True,
        text=True,
        env={**__import__('os').environ, 'PYTHON': sys.executable},
        timeout=600,
    )
    assert res.returncode == 0, res.stderr[-2000:]
    assert (tmp_path / 'scale_float32.json').exists() and (
        tmp_path / 'scale_bfloat16.json'
    ).exists()
    assert res.stdout.count('HARA share') == 2
    assert res.stdout.count('HARA on lowrank-16 states') == 2  # the realistic family by default


@pytest.mark.skipif(not torch.cuda.is_available(), reason='no CUDA device')
def test_bench_scale_cuda():
    assert bench_scale_cli(['--tiny', '--device', 'cuda']) == 0


def test_bench_batch_families():
    """`bench_batch` makes each family: 'lowrank' states of a prompt live near `rank` directions
    (all but the 5 % noise), different for each prompt; 'isotropic' fill every direction."""
    from hara_ref.bench.solvers import bench_batch

    h, m, r, g = bench_batch(2, 4, 64, 32, family='lowrank', rank=4)
    assert h.shape == (8, 64, 32) and h.dtype == torch.float32 and m.shape == (8, 64)
    assert ((r.view(2, 4) == 0).any(1) & (r.view(2, 4) == 1).any(1)).all()  # both outcomes
    s = torch.linalg.svdvals(h[:4].reshape(-1, 32).double())  # prompt 0's tokens
    assert float((s[4:] ** 2).sum() / (s**2).sum()) < 0.01  # noise: 0.05^2 x 28/32 = 0.0022
    both = torch.linalg.svdvals(h.reshape(-1, 32).double())  # two prompts: two subspaces
    assert float((both[4:8] ** 2).sum() / (both**2).sum()) > 0.2
    iso = torch.linalg.svdvals(bench_batch(2, 4, 64, 32, family='isotropic')[0].reshape(-1, 32))
    assert float(iso[-1] / iso[0]) > 0.5
    with pytest.raises(ValueError, match='family must be one of'):
        bench_batch(2, 4, 64, 32, family='gauss')


def test_bench_hara_family_json(tmp_path):
    "`bench hara --family lowrank --outer lbfgs --out F`: the result names its family and solves."
    out = tmp_path / 'h.json'
    argv = '--prompts 1 --rollouts 4 --length 32 --dim 16 --L-b 4 --family lowrank --rank 4'
    assert bench_hara_cli([*argv.split(), '--outer', 'lbfgs', '--out', str(out)]) == 0
    res = json.loads(out.read_text())
    assert res['args']['outer'] == 'lbfgs' and res['result']['family'] == 'lowrank-4'
    its = res['result']['bary_iters_group']
    assert len(its) == 2 and 0 < max(its) < res['args']['max_iter']  # no group at the cap
