"""HARA inside TRL's GRPOTrainer (hara_ref.practice.trl): stock parity at kappa=0, the oracle's
advantages reach TRL's loss, 1 vs 2 processes, bad config."""

import os
import signal
import subprocess
import sys
import warnings
from pathlib import Path
import pytest
import torch

os.environ.setdefault('HF_HUB_OFFLINE', '1')
trl = pytest.importorskip('trl')
from datasets import Dataset
from transformers import AutoModelForCausalLM, AutoTokenizer
from transformers.utils import logging as hf_logging
from trl import GRPOConfig, GRPOTrainer
from hara_ref.hara.weights import hara_advantages, reweight_advantages
from hara_ref.hara.baselines import token_entropy
from hara_ref.train.policy import char_tokenizer, tiny_qwen3, save_policy
from hara_ref.practice.cli import train_cli
from hara_ref.practice.trl import HaraConfig, HaraGRPOTrainer, oracle_advantages, rollout_labels

ROOT = Path(__file__).resolve().parents[1]
# a small CPU budget for the barycenter
NOV = dict(bary_kw=dict(max_iter=3, inner_iter=20), plan_kw=dict(num_iter_max=20))
G = 4


@pytest.fixture(scope='module')
def tiny(tmp_path_factory):
    "A tiny random Qwen3 with the character tokenizer, saved to a local folder."
    hf_logging.set_verbosity_error()
    hf_logging.disable_progress_bar()
    warnings.filterwarnings('ignore', category=FutureWarning)
    path = tmp_path_factory.mktemp('trl') / 'tiny'
    tok = char_tokenizer()
    save_policy(tiny_qwen3(tok, hidden_size=32, seed=0), tok, path)
    return path


def dataset():
    "Prompts of equal token length (no left padding), in memory."
    return Dataset.from_list(
        [
            dict(prompt=f"<bos>{a}+{b}=", answer=str(a + b))
            for a in range(10, 30)
            for b in range(10, 30)
        ]
    )


def parity(completion_ids, **kw):
    "A reward read off the tokens: parity of their sum (mixed outcomes inside a group)."
    return [float(sum(c) % 2) for c in completion_ids]


def make(cls, path, tmp, loss_type='grpo', steps=3, **kw):
    args = GRPOConfig(
        output_dir=str(tmp / 'out'),
        per_device_train_batch_size=8,
        num_generations=G,
        max_completion_length=8,
        max_steps=steps,
        learning_rate=1e-3,
        report_to='none',
        logging_steps=1,
        save_strategy='no',
        use_cpu=True,
        # TRL's default bf16 autocasts on CPU too
        seed=0,
        loss_type=loss_type,
        disable_tqdm=True,
        bf16=False,
    )
    return cls(
        model=str(path),
        reward_funcs=parity,
        args=args,
        train_dataset=dataset(),
        processing_class=AutoTokenizer.from_pretrained(path),
        **kw,
    )


def flat_params(model):
    return torch.cat([p.detach().flatten() for p in model.parameters()])


def test_import_hara_ref_does_not_import_trl():
    pkg = ROOT / 'hara_ref'
    mods = [
        '.'.join(('hara_ref',) + p.relative_to(pkg).with_suffix('').parts)
        for p in pkg.rglob('*.py')
        if p.stem not in ('trl', '__init__', '_modidx')
    ]
    code = (
        f"import sys, importlib, hara_ref\nfor m in {mods!r}: importlib.import_module(m)\n"
        f"assert 'trl' not in sys.modules, 'trl was imported'\nprint(len({mods!r}))"
    )
    r = subprocess.run([sys.executable, '-c', code], capture_output=True, text=True, cwd=ROOT)
    assert r.returncode == 0, r.stderr
    assert int(r.stdout) >= 10  # the modules really were imported


@pytest.mark.parametrize('loss_type', ['grpo', 'dr_grpo', 'dapo'])
def test_kappa0_equals_stock_grpotrainer(tiny, tmp_path, loss_type):
    stock = make(GRPOTrainer, tiny, tmp_path, loss_type)
    stock.train()
    ours = make(HaraGRPOTrainer, tiny, tmp_path, loss_type, hara=HaraConfig(kappa=0.0))
    ours.train()
    p0, p1, start = (
        flat_params(stock.model),
        flat_params(ours.model),
        flat_params(AutoModelForCausalLM.from_pretrained(tiny)),
    )
    assert (p0 - start).abs().max() > 1e-4  # training moved the parameters ...
    assert (p0 - p1).abs().max() <= 1e-6  # ... and HARA at kappa=0 moved them exactly as TRL does
    assert ours.state.log_history[0]['hara/weight_std'] == 0.0


class Recording(HaraGRPOTrainer):
    """Keeps the batch `_generate_and_score_completions` returns and the advantages `_compute_loss`
    receives."""

    def _generate_and_score_completions(self, inputs):
        self.out = super()._generate_and_score_completions(inputs)
        return self.out

    def _hara_advantages(self, out, hidden, entropy):
        self.hidden, self.entropy = hidden, entropy
        return super()._hara_advantages(out, hidden, entropy)

    def _compute_loss(self, model, inputs):
        self.received = inputs['advantages'].detach().clone()
        return super()._compute_loss(model, inputs)


@pytest.mark.parametrize('reweight', ['hara-tok', 'shear', 'entropy', 'position'])
def test_loss_receives_the_oracle_advantages(tiny, tmp_path, reweight):
    tr = make(
        Recording, tiny, tmp_path, steps=1, hara=HaraConfig(reweight=reweight, novelty_kw=NOV)
    )
    tr.train()
    o, (B, T) = tr.out, tr.out['completion_ids'].shape
    # the same rollouts, scored independently: a plain forward of the start model, rewards, TRL's
    # group ids and base advantages
    net = AutoModelForCausalLM.from_pretrained(tiny)
    ids, am = (
        torch.cat([o['prompt_ids'], o['completion_ids']], 1),
        torch.cat([o['prompt_mask'], o['completion_mask']], 1),
    )
    with torch.no_grad():
        res = net(input_ids=ids, attention_mask=am, output_hidden_states=True)
    hidden, mask = res.hidden_states[-1][:, -T:], o['completion_mask'].bool()  # (B, T, d), (B, T)
    # the trainer's extra forward is a plain forward of the policy
    if reweight in ('hara-tok', 'shear'):
        assert (tr.hidden - hidden)[mask].abs().max() <= 1e-4
        hidden = tr.hidden
    # (B,)
    rewards = torch.tensor(parity([c[m].tolist() for c, m in zip(o['completion_ids'], mask)]))
    gid = torch.arange(B) // G
    r = rewards.view(-1, G)
    # TRL's scale_rewards='group'
    base = ((r - r.mean(1, keepdim=True)) / (r.std(1, keepdim=True) + 1e-4)).flatten()
    if reweight == 'hara-tok':
        want, _ = hara_advantages(
            hidden, mask, rewards, gid, granularity='tok', advantages=base, **NOV
        )
    else:
        want, _ = reweight_advantages(
            reweight,
            hidden,
            mask,
            rewards,
            gid,
            advantages=base,
            logits_entropy=token_entropy(res.logits[:, -T - 1 : -1]),
        )
    got = o['advantages']
    assert got.shape == (B, T) and tr.received.ndim == 2
    assert (got - want).abs().max() <= 1e-6
    # TRL only shuffles rows
    assert (
        torch.sort(tr.received.flatten()).values - torch.sort(got.flatten()).values
    ).abs().max() == 0
    assert (want != base[:, None] * mask).any()  # the reweighting changed something
    logs = tr.state.log_history[0]
    assert {
        'hara/weight_mean',
        'hara/weight_std',
        'hara/weight_min',
        'hara/weight_max',
        'hara/time',
        'hara/time_forward',
    } <= set(logs)
    assert ('hara/bary_iters' in logs) == (reweight == 'hara-tok')


def test_whole_groups_per_process_equal_the_global_batch():
    """The local path (groups never span processes): the oracle on each half == the rows of the
    oracle
    on the whole batch."""
    g = torch.Generator().manual_seed(0)
    hidden, L = torch.randn(16, 9, 8, generator=g), torch.randint(3, 10, (16,), generator=g)
    mask = torch.arange(9) < L[:, None]
    rewards, gid = torch.tensor([0.0, 1.0] * 8), torch.arange(16) // G
    A = torch.where(rewards > 0, 1.0, -1.0)
    full, _ = oracle_advantages(HaraConfig(novelty_kw=NOV), hidden, mask, rewards, gid, A)
    for rows in (slice(0, 8), slice(8, 16)):
        part, _ = oracle_advantages(
            HaraConfig(novelty_kw=NOV), hidden[rows], mask[rows], rewards[rows], gid[rows], A[rows]
        )
        assert (part - full[rows]).abs().max() <= 1e-6


def test_rollout_labels_unscorable_rows_get_their_own_group():
    rpf = torch.tensor([[1.0, float('nan')], [0.0, 1.0], [float('nan'), float('nan')], [1.0, 1.0]])
    r, gid = rollout_labels(rpf, torch.tensor([1.0, 2.0]), 2)
    assert r.tolist() == [1.0, 2.0, 0.0, 3.0] and gid.tolist() == [0, 0, 6, 1]


def run_killing_group(
    cmd: list, env: dict, timeout: float, marker: str
) -> subprocess.CompletedProcess:
    """subprocess.run in a new session; on timeout the launcher's process group and every process
    whose command line holds `marker` (the ranks run in sessions of their own) are killed."""
    p = subprocess.Popen(
        cmd,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        start_new_session=True,
    )
    try:
        out, err = p.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        os.killpg(p.pid, signal.SIGKILL)
        subprocess.run(['pkill', '-9', '-f', marker])
        p.communicate()
        raise
    return subprocess.CompletedProcess(cmd, p.returncode, out, err)


@pytest.mark.parametrize('per_process', [2, 4])
def test_two_processes_match_one(tiny, tmp_path, per_process):
    """accelerate launch --num_processes 2 (gloo, CPU) vs one process with the same global batch;
    groups of 4 span both
    processes (2 rollouts each: the gathered path) or not (4 each: each process alone)."""
    env = {**os.environ, 'OMP_NUM_THREADS': '1', 'HF_HUB_OFFLINE': '1', 'PYTHONPATH': str(ROOT)}
    script, one, two = ROOT / 'tests' / 'trl_ddp_run.py', tmp_path / 'one.pt', tmp_path / 'two.pt'
    acc = lambda port: [
        str(Path(sys.executable).parent / 'accelerate'),
        'launch',
        '--multi_gpu',
        '--num_processes',
        '2',
        '--num_machines',
        '1',
        '--mixed_precision',
        'no',
        '--dynamo_backend',
        'no',
        '--main_process_port',
        str(port),
    ]
    # a run that hangs (seen on a loaded machine: one rank waiting after the other exited) is
    # retried
    for attempt, port in enumerate((29517, 29533, 29549)):
        try:
            r2 = run_killing_group(
                acc(port) + [str(script), str(tiny), str(two), str(per_process), '3', 'dapo'],
                {**env, 'CUDA_VISIBLE_DEVICES': ''},
                300,
                str(two),
            )
            break
        except subprocess.TimeoutExpired:
            if attempt == 2:
                raise
    assert r2.returncode == 0, r2.stderr[-3000:]
    r1 = subprocess.run(
        [sys.executable, str(script), str(tiny), str(one), str(2 * per_process), '3', 'dapo'],
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert r1.returncode == 0, r1.stderr[-3000:]
    a, b = torch.load(two), torch.load(one)
    assert (a['world'], b['world']) == (2, 1)
    # (2 per_process, T) advantages of each step, rows in global order
    for x, y in zip(a['adv'], b['adv']):
        T = min(x.shape[1], y.shape[1])
        assert (
            (x[:, :T] - y[:, :T]).abs().max() <= 1e-6
            and x[:, T:].abs().sum() == 0
            and y[:, T:].abs().sum() == 0
        )
    # token-level, not constant rows
    assert len(a['adv']) == 3 and any((x != x[:, :1]).any() for x in a['adv'])
    start = AutoModelForCausalLM.from_pretrained(tiny).state_dict()
    # the steps moved the model
    assert max((a['params'][n] - start[n].double()).abs().max() for n in a['params']) > 1e-3
    assert max((a['params'][n] - b['params'][n]).abs().max() for n in a['params']) <= 1e-6


@pytest.mark.parametrize(
    'kw, msg',
    [
        (dict(reweight='hara'), 'reweight'),
        (dict(L_b=1), 'L_b'),
        (dict(clip=(2.0, 3.0)), 'clip'),
        (dict(metric='cosine'), 'metric'),
        (dict(novelty_kw=dict(bogus=1)), 'bogus'),
        (dict(reweight='hara-seq', span_len=4), 'span_len'),
    ],
)
def test_bad_hara_config_fails_before_training(kw, msg):
    """Field checks in HaraConfig, the rest by one oracle call on a synthetic batch: all before TRL
    even loads the model (model=None)."""
    with pytest.raises(ValueError, match=msg):
        HaraGRPOTrainer(model=None, hara=HaraConfig(**kw))


def test_hidden_layer_out_of_range_fails_before_training(tiny, tmp_path):
    with pytest.raises(ValueError, match='hidden_layer=3 is out of range'):
        make(HaraGRPOTrainer, tiny, tmp_path, hara=HaraConfig(hidden_layer=3))
    assert not (tmp_path / 'out').exists() or not any((tmp_path / 'out').iterdir())


def test_hara_ref_train_engine_trl(tmp_path, capsys):
    argv = [
        '--engine',
        'trl',
        '--out',
        str(tmp_path / 'run'),
        '--seeds',
        '1',
        '--steps',
        '2',
        '--sft-steps',
        '2',
        '--eval-prompts',
        '2',
        '--eval-samples',
        '2',
        '--eval-every',
        '1',
        '--prompts-per-step',
        '2',
        '--group-size',
        '4',
        '--max-new-tokens',
        '8',
        '--reweight',
        'hara-tok',
        '--hidden-size',
        '32',
        '--bary-iters',
        '2',
        '--plan-iters',
        '10',
    ]
    assert train_cli(argv) == 0
    run = tmp_path / 'run'
    assert {'config.json', 'start_eval.json', 'curves.png', 'summary.json', 'sft'} <= {
        p.name for p in run.iterdir()
    }
    rows = [
        __import__('json').loads(l)
        for l in (run / 'runs' / 'grpo+hara-tok-s0' / 'metrics.jsonl').read_text().splitlines()
    ]
    assert [r['step'] for r in rows if r['kind'] == 'train'] == [1, 2] and [
        r['step'] for r in rows if r['kind'] == 'eval'
    ] == [0, 1, 2]
    assert all(
        r['t_hara'] > 0
        and 0.5 <= r['hara/weight_min'] <= r['hara/weight_mean'] <= r['hara/weight_max'] <= 2
        for r in rows
        if r['kind'] == 'train'
    )
    assert (
        run / 'runs' / 'grpo+hara-tok-s0' / 'final' / 'config.json'
    ).exists() and 'grpo+hara-tok' in capsys.readouterr().out


@pytest.mark.parametrize(
    'extra, msg', [(['--method', 'rloo'], 'not a TRL loss'), (['--resume'], '--resume')]
)
def test_engine_trl_refuses_what_it_cannot_do(tmp_path, capsys, extra, msg):
    from hara_ref.train.rl import BASE_METHODS

    if 'rloo' in extra and 'rloo' not in BASE_METHODS:
        pytest.skip('no rloo method in this version of the trainer')
    assert train_cli(['--engine', 'trl', '--out', str(tmp_path / 'r')] + extra) == 2
    assert msg in capsys.readouterr().err and not (tmp_path / 'r' / 'sft').exists()


def test_span_separators_are_step_boundaries():
    "'hara-tok' with span_sep_ids == the oracle with boundaries after each separator token."
    from hara_ref.hara.rollouts import step_boundaries

    g = torch.Generator().manual_seed(1)
    hidden, ids = torch.randn(8, 10, 8, generator=g), torch.randint(0, 5, (8, 10), generator=g)
    mask = torch.arange(10) < torch.randint(4, 11, (8,), generator=g)[:, None]
    rewards, gid, A = (
        torch.tensor([0.0, 1.0] * 4),
        torch.arange(8) // 4,
        torch.tensor([-1.0, 1.0] * 4),
    )
    got, rw = oracle_advantages(
        HaraConfig(reweight='hara-tok', span_sep_ids=(3,), novelty_kw=NOV),
        hidden,
        mask,
        rewards,
        gid,
        A,
        ids,
    )
    want, _ = hara_advantages(
        hidden,
        mask,
        rewards,
        gid,
        granularity='span',
        advantages=A,
        boundaries=step_boundaries(ids == 3),
        **NOV,
    )
    assert rw.method == 'hara-span' and (got - want).abs().max() == 0
    tok, _ = oracle_advantages(HaraConfig(novelty_kw=NOV), hidden, mask, rewards, gid, A)
    assert (got - tok).abs().max() > 1e-3  # spans average the token novelty: a different result
