"""Every command holds `hara-ref train`'s rule: a bad flag ends it with exit code 2 and one line on
stderr that names the flag, before any work and before anything is written."""

import os
import pytest

os.environ.setdefault('HF_HUB_OFFLINE', '1')
os.environ.setdefault('TRANSFORMERS_OFFLINE', '1')
from hara_ref.practice.cli import main

# (command and flags, the start of the line after `hara-ref COMMAND: error: `)
BAD = [
    ('study --workers 0', '--workers must be an integer >= 1, got 0'),
    ('study --threads -1', '--threads must be an integer >= 1, got -1'),
    ('study --only nonsense', '--only nonsense matches no cell of the grid'),
    ('study --quick --only sum', '--only sum matches no cell of the quick grid'),
    ('study --seeds 0', '--seeds is empty'),
    ('study --seeds 1,1', '--seeds lists 1 more than once'),
    ('study --steps -1', '--steps must be an integer >= 1, got -1'),
    ('study --eval-samples 0', '--eval-samples must be an integer >= 1, got 0'),
    ('study --eval-every 0', '--eval-every must be an integer >= 1, got 0'),
    ('study --eval-prompts 0', '--eval-prompts must be an integer >= 1, got 0'),
    ('study --sft-steps -1', '--sft-steps must be an integer >= 0, got -1'),
    ('study --steps x', "argument --steps: invalid int value: 'x'"),
    ('bench ot --threads 0', '--threads must be an integer >= 1, got 0'),
    ('bench ot --L 128 1', '--L must be an integer >= 2, got 1'),
    ('bench ot --repeat 0', '--repeat must be an integer >= 1, got 0'),
    ('bench ot --reg 0', '--reg must be a finite real number > 0, got 0.0'),
    ('bench ot --tol nan', '--tol must be a finite real number > 0, got nan'),
    ('bench ot --alpha 2', '--alpha must be a finite real number in [0, 1], got 2.0'),
    ('bench ot --data uniform', "argument --data: invalid choice: 'uniform'"),
    ('bench ot --out {tmp}', '--out {tmp} is a folder, not a file'),
    (
        'bench ot --out {tmp}/no/ot.json',
        '--out {tmp}/no/ot.json: the folder {tmp}/no does not exist',
    ),
    ('bench hara --repeats 0', '--repeats must be an integer >= 1, got 0'),
    ('bench hara --prompts 0', '--prompts must be an integer >= 1, got 0'),
    ('bench hara --rollouts 1', '--rollouts must be an integer >= 2, got 1'),
    ('bench hara --threads 0', '--threads must be an integer >= 1, got 0'),
    ('bench hara --inner-iter 0', '--inner-iter must be an integer >= 1, got 0'),
    ('bench hara --anderson -1', '--anderson must be an integer >= 0, got -1'),
    ('bench hara --max-iter -5', '--max-iter must be an integer >= 1, got -5'),
    ('bench hara --family gauss', "argument --family: invalid choice: 'gauss'"),
    ('bench hara --family lowrank --rank 64 --dim 32', '--rank 64 > --dim 32'),
    ('bench hara --outer lbfgs --anderson 5', "--anderson=5 is an option of --outer='plain'"),
    ('bench hara --out {tmp}/no/h.json', '--out {tmp}/no/h.json: the folder {tmp}/no'),
    ('bench scale --outer newton', "argument --outer: invalid choice: 'newton'"),
    ('bench scale --outer lbfgs --anderson 5', "--anderson=5 is an option of --outer='plain'"),
    ('bench scale --sizes 0.6B 70B', "--sizes must be one of 0.6B, 1.7B, 4B, 8B, tiny, got '70B'"),
    ('bench scale --threads 0', '--threads must be an integer >= 1, got 0'),
    ('bench scale --hara-prompts 32', '--hara-prompts 32 > --prompts 16'),
    ('bench scale --decode-steps 0', '--decode-steps must be an integer >= 1, got 0'),
    ('bench scale --out {tmp}/no/scale.json', '--out {tmp}/no/scale.json: the folder {tmp}/no'),
    ('train --dtype fp16', '--dtype fp16 needs a CUDA --device'),
    ('train --device tpu', "--device must be cpu, cuda or cuda:N, got 'tpu'"),
    ('train --device cuda:x', "--device must be cpu, cuda or cuda:N, got 'cuda:x'"),
    ('train --steps x', "argument --steps: invalid int value: 'x'"),
    ('train --barycenter exact --plan-iters 5', '--plan-iters caps Newton or Sinkhorn steps'),
    ('compare hora --workers 0', '--workers must be an integer >= 1, got 0'),
    ('compare hp-rlvr --device tpu', "--device must be cpu, cuda or cuda:N, got 'tpu'"),
]


@pytest.fixture
def no_work(monkeypatch):
    "A command that gets past its checks fails the test at once (instead of running for hours)."
    import hara_ref.practice.commands as commands
    import hara_ref.trainer.experiment as experiment

    def work(*a, **k):
        raise AssertionError('the command started its work')

    for name in ('run_study', 'bench_ot', 'bench_hara', 'bench_hara_small', 'bench_scale_main'):
        monkeypatch.setattr(commands, name, work)
    monkeypatch.setattr(experiment, 'run_variants', work)


@pytest.mark.parametrize('argv, said', BAD, ids=[a for a, _ in BAD])
def test_a_bad_flag_ends_the_command_with_one_line_before_any_work(
    no_work, tmp_path, monkeypatch, capsys, argv, said
):
    "Run where a default `--out` would land in tmp_path: afterwards it must still be empty."
    monkeypatch.chdir(tmp_path)
    args = [a.replace('{tmp}', str(tmp_path)) for a in argv.split()]
    command = ' '.join(a for a in args[:2] if not a.startswith('-'))
    assert main(args) == 2
    out, err = capsys.readouterr()
    assert err.startswith(f"hara-ref {command}: error: {said.replace('{tmp}', str(tmp_path))}"), err
    assert err.count('\n') == 1 and out == ''
    flag = [a for a in args if a.startswith('--')][-1]  # the flag the line is about
    assert flag in err
    assert list(tmp_path.iterdir()) == []


def test_a_cuda_device_the_machine_lacks_is_refused(no_work, tmp_path, monkeypatch, capsys):
    import torch

    monkeypatch.chdir(tmp_path)
    n = torch.cuda.device_count()
    assert main(['train', '--device', f'cuda:{n}']) == 2
    said = 'no CUDA device is available' if n == 0 else f'this machine has {n} CUDA devices'
    assert said in capsys.readouterr().err and list(tmp_path.iterdir()) == []
    if n == 0:
        assert main(['bench', 'scale', '--device', 'cuda']) == 2
        err = capsys.readouterr().err
        assert err == 'hara-ref bench scale: error: --device cuda but no CUDA device is available\n'
