"""HARA inside TRL's GRPOTrainer (hara_ref.practice.trl): stock parity at kappa=0, the oracle's
advantages reach TRL's loss, 1 vs 2 processes, bad config."""

import copy
import json
import os
import re
import signal
import socket
import subprocess
import sys
import warnings
from dataclasses import fields
from pathlib import Path
import pytest
import torch

os.environ.setdefault('HF_HUB_OFFLINE', '1')
trl = pytest.importorskip('trl')
from datasets import Dataset
from transformers import AutoModelForCausalLM, AutoTokenizer
from transformers.utils import logging as hf_logging
from trl import GRPOConfig, GRPOTrainer
from hara_ref.engine.hara_engine import hara_advantages, reweight_advantages
from hara_ref.hara.baselines import token_entropy
from hara_ref.train.policy import char_tokenizer, tiny_qwen3
from hara_ref.trainer.loop import save_policy
from hara_ref.practice.cli import train_cli
from hara_ref.engine.verifier import rounding_tol
from hara_ref.practice.trl_config import (
    HaraConfig,
    oracle_advantages,
    rollout_labels,
    sep_token_ids,
)
from hara_ref.practice.trl import HaraGRPOTrainer, completion_hidden

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


def make(cls, path, tmp, loss_type='grpo', steps=3, args_kw=None, **kw):
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
        **{'bf16': False, **(args_kw or {})},
    )
    return cls(
        model=str(path),
        reward_funcs=kw.pop('reward_funcs', parity),
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
        Recording,
        tiny,
        tmp_path,
        steps=1,
        # HARA's options for HARA only: a baseline refuses them
        hara=HaraConfig(reweight=reweight, novelty_kw=NOV if reweight == 'hara-tok' else {}),
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
    oracle on the whole batch."""
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
    r, gid, o = rollout_labels(rpf, torch.tensor([1.0, 2.0]), 2)
    assert r.tolist() == [1.0, 2.0, 0.0, 3.0] and gid.tolist() == [0, 0, 6, 1]
    assert o.tolist() == [1.0, 1.0, 0.0, 2.0]  # the values the functions returned, unweighted


def test_rollout_labels_outcome_columns_and_threshold():
    """The outcome is the sum of the values the chosen functions return, not weighted (>= threshold:
    1); unscored by them: alone."""
    rpf = torch.tensor([[1.0, 0.3], [0.0, 0.9], [float('nan'), 0.2], [1.0, 0.7], [0.0, 0.1]])
    w = torch.tensor([1.0, 0.5])
    r, gid, o = rollout_labels(rpf, w, 5, outcome_cols=(0,))
    assert torch.allclose(r, torch.tensor([1.15, 0.45, 0.1, 1.35, 0.05]))
    assert o.tolist() == [1.0, 0.0, 0.0, 1.0, 0.0] and gid.tolist() == [0, 0, 7, 0, 0]
    _, gid, o = rollout_labels(rpf, w, 5, outcome_cols=(1,), outcome_threshold=0.3)
    assert o.tolist() == [1.0, 1.0, 0.0, 1.0, 0.0] and gid.tolist() == [0] * 5
    _, _, o = rollout_labels(rpf, w, 5, outcome_cols=(0, 1), outcome_threshold=1.2)
    assert o.tolist() == [1.0, 0.0, 0.0, 1.0, 0.0]


def free_port() -> int:
    "A TCP port nobody listens on now (parallel test workers must not share one)."
    with socket.socket() as s:
        s.bind(('127.0.0.1', 0))
        return s.getsockname()[1]


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


def test_two_processes_match_one(tiny, tmp_path):
    """accelerate launch --num_processes 2 (gloo, CPU) vs one process with the same global batch;
    groups of 4 span both processes (2 rollouts each: the gathered path) or not (4 each: each
    process alone). Both layouts run in one launch, one after the other."""
    env = {**os.environ, 'OMP_NUM_THREADS': '1', 'HF_HUB_OFFLINE': '1', 'PYTHONPATH': str(ROOT)}
    script, layouts = ROOT / 'tests' / 'trl_ddp_run.py', (2, 4)  # rollouts per process
    one = [tmp_path / f'one{k}.pt' for k in layouts]
    two = [tmp_path / f'two{k}.pt' for k in layouts]
    names = lambda paths: ','.join(map(str, paths))
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
    for attempt, port in enumerate(free_port() for _ in range(3)):
        try:
            r2 = run_killing_group(
                acc(port) + [str(script), str(tiny), names(two), names(layouts), '3', 'dapo'],
                {**env, 'CUDA_VISIBLE_DEVICES': ''},
                300 * len(layouts),
                str(two[0]),
            )
            break
        except subprocess.TimeoutExpired:
            if attempt == 2:
                raise
    assert r2.returncode == 0, r2.stderr[-3000:]
    # the one-process run here, in this process (TRL already imported, as the tests above that
    # train in process): a fresh interpreter spent most of its time importing TRL
    from trl_ddp_run import train as train_one  # tests/trl_ddp_run.py

    for path, k in zip(one, layouts):
        train_one(str(tiny), str(path), 2 * k, 3, 'dapo')
    start = AutoModelForCausalLM.from_pretrained(tiny).state_dict()
    for k, path_two, path_one in zip(layouts, two, one):
        a, b = torch.load(path_two), torch.load(path_one)
        assert (a['world'], b['world']) == (2, 1)
        # (2 k, T) advantages of each step, rows in global order
        for x, y in zip(a['adv'], b['adv']):
            T = min(x.shape[1], y.shape[1])
            assert x.shape[0] == y.shape[0] == 2 * k
            assert (x[:, :T] - y[:, :T]).abs().max() <= 1e-6
            assert x[:, T:].abs().sum() == 0 and y[:, T:].abs().sum() == 0
        # token-level, not constant rows
        assert len(a['adv']) == 3 and any((x != x[:, :1]).any() for x in a['adv'])
        # the steps moved the model
        moved = max((a['params'][n] - start[n].double()).abs().max() for n in a['params'])
        assert moved > 1e-3
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
    from hara_ref.trainer.step import BASE_METHODS

    if 'rloo' in extra and 'rloo' not in BASE_METHODS:
        pytest.skip('no rloo method in this version of the trainer')
    assert train_cli(['--engine', 'trl', '--out', str(tmp_path / 'r')] + extra) == 2
    assert msg in capsys.readouterr().err and not (tmp_path / 'r' / 'sft').exists()


def test_trl_run_refuses_a_folder_that_holds_a_run(tmp_path):
    "The TRL engine never deletes results: a run folder with metrics.jsonl is refused and kept."
    from hara_ref.practice.trl_train import train_run_trl
    from hara_ref.trainer.step import TrainConfig

    d, row = tmp_path / 'grpo-s0', '{"kind": "eval", "step": 0}\n'
    d.mkdir()
    (d / 'metrics.jsonl').write_text(row)
    with pytest.raises(ValueError, match='already holds a run'):
        train_run_trl(TrainConfig(), d, tmp_path / 'no-checkpoint', [], [], None)
    assert (d / 'metrics.jsonl').read_text() == row


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


# --- outcome groups from the reward functions a TRL user has ------------------------------------


def accuracy(completions, answer, **kw):
    "A verifiable reward: the completion starts with the answer (never, for the random model)."
    return [float(c.strip().startswith(a)) for c, a in zip(completions, answer)]


def style(completions, **kw):
    "A graded format score, as a reward model gives: continuous, so no two rollouts share it."
    return [0.5 * sum(map(ord, c)) / (128 * max(len(c), 1)) for c in completions]


def run_recorded(tiny, tmp, hara, steps=2):
    "Train with accuracy + style; the trainer and HARA's 'reweighted none' warnings."
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter('always')
        tr = make(Recording, tiny, tmp, steps=steps, reward_funcs=[accuracy, style], hara=hara)
        tr.train()
    return tr, [str(w.message) for w in caught if 'HARA reweighted none' in str(w.message)]


def reweighted_fracs(tr) -> list:
    return [h['hara/reweighted_frac'] for h in tr.state.log_history if 'hara/reweighted_frac' in h]


def test_accuracy_decides_the_outcome_by_default(tiny, tmp_path, capsys):
    """Accuracy + a graded format score: accuracy (the first function) makes the outcome groups,
    the weights move, and they are the oracle's with `outcomes=`."""
    tr, warned = run_recorded(tiny, tmp_path, HaraConfig(novelty_kw=NOV))
    line = capsys.readouterr().out
    assert (
        "outcome groups: the rollouts of one prompt with equal 'accuracy' (the first of the "
        "reward functions ['accuracy', 'style']; HaraConfig.outcome_funcs)"
    ) in line
    rec, o = tr.hara_record, tr.out
    assert rec['outcomes'].tolist() == [0.0] * 8 and len(set(rec['rewards'].tolist())) == 8
    assert reweighted_fracs(tr) == [1.0, 1.0] and not warned
    w = rec['weights'][rec['own']]
    assert (w != 1).double().mean() > 0.9 and w.min() >= 0.5 and w.max() <= 2.0
    mask = o['completion_mask'].bool()
    want, _ = hara_advantages(
        tr.hidden,
        mask,
        rec['rewards'],
        rec['group_ids'],
        advantages=rec['reweighting'].base,
        outcomes=rec['outcomes'],
        **NOV,
    )
    assert (o['advantages'] - want).abs().max() <= 1e-6


def test_summed_graded_reward_leaves_every_rollout_alone_and_warns(tiny, tmp_path, capsys):
    """Outcome = accuracy + style (the summed reward): every rollout is alone in its group, no
    weight moves, `hara/reweighted_frac` is 0 in both steps and the trainer warns at both (the 1st
    and 2nd such step)."""
    tr, warned = run_recorded(
        tiny, tmp_path, HaraConfig(novelty_kw=NOV, outcome_funcs=[0, 'style'])
    )
    assert "with equal 'accuracy' + 'style'" in capsys.readouterr().out
    assert reweighted_fracs(tr) == [0.0, 0.0] and (tr.hara_record['weights'] == 1).all()
    assert len(warned) == 2
    assert (
        'none of the 8 rollouts whose advantage is not 0 in step 1 (steps like this so far: 1; '
        'this warning comes again when they reach 2): 8 of them are alone in their outcome group'
    ) in warned[0]
    assert 'in step 2 (steps like this so far: 2;' in warned[1]
    assert "here 'accuracy' + 'style'; " in warned[0] and 'HaraConfig.outcome_funcs' in warned[0]


def test_outcome_threshold_makes_binary_outcomes(tiny, tmp_path):
    tr, _ = run_recorded(
        tiny, tmp_path, HaraConfig(novelty_kw=NOV, outcome_funcs=['style'], outcome_threshold=0.3)
    )
    style_ = tr._hara_rewards_per_func[:, 1]  # (B,) weight 1
    assert tr.hara_record['outcomes'].tolist() == (style_ >= 0.3).double().tolist()
    assert tr.hara.outcome_funcs == ('style',) and tr.hara_outcome_cols == (1,)


def test_outcome_funcs_must_name_a_reward_function(tiny, tmp_path):
    with pytest.raises(ValueError, match=r"no reward function is named 'accuracy'; TRL names them"):
        make(HaraGRPOTrainer, tiny, tmp_path, hara=HaraConfig(outcome_funcs=['accuracy']))
    with pytest.raises(ValueError, match='index 1 is out of range'):
        make(HaraGRPOTrainer, tiny, tmp_path, hara=HaraConfig(outcome_funcs=[1]))


# --- TRL's conventions: TrlParser and YAML, refusals, the saved config, the example script -------


def test_every_field_through_trlparser_cli_and_yaml(tmp_path):
    from trl import TrlParser

    base = ['--output_dir', str(tmp_path), '--use_cpu', 'true', '--bf16', 'false']
    want = HaraConfig(
        kappa=0.5,
        clip=(0.7, 1.5),
        alpha=0.3,
        L_b=8,
        reg=0.1,
        metric='w',
        hidden_layer=-2,
        span_sep_ids=['\n', 7],
        novelty_kw=dict(bary_kw=dict(max_iter=5), normalize='none'),
        forward_batch_size=4,
        outcome_funcs=['accuracy', 1],
        outcome_threshold=0.5,
    )
    cli = base + ['--kappa', '0.5', '--clip', '0.7', '1.5', '--alpha', '0.3', '--L_b', '8']
    cli += ['--reg', '0.1', '--metric', 'w', '--hidden_layer', '-2', '--span_sep_ids', '\n', '7']
    cli += ['--novelty_kw', '{"bary_kw": {"max_iter": 5}, "normalize": "none"}']
    cli += ['--forward_batch_size', '4', '--outcome_funcs', 'accuracy', '1']
    cli += ['--outcome_threshold', '0.5']
    yml = tmp_path / 'c.yaml'
    yml.write_text(
        f'output_dir: {tmp_path}\nuse_cpu: true\nbf16: false\nkappa: 0.5\nclip: [0.7, 1.5]\n'
        'alpha: 0.3\nL_b: 8\nreg: 0.1\nmetric: w\nhidden_layer: -2\nspan_sep_ids: ["\\n", 7]\n'
        'novelty_kw: {bary_kw: {max_iter: 5}, normalize: none}\nforward_batch_size: 4\n'
        'outcome_funcs: [accuracy, 1]\noutcome_threshold: 0.5\n'
    )
    for argv in (cli, ['--config', str(yml)]):
        grpo, hara = TrlParser((GRPOConfig, HaraConfig)).parse_args_and_config(argv)
        assert hara == want and grpo.output_dir == str(tmp_path)
    # every field but those that exclude the ones set above differs from its default
    default, rest = HaraConfig(), {'reweight', 'span_len', 'reweight_kw'}
    assert all(
        getattr(want, f.name) != getattr(default, f.name)
        for f in fields(want)
        if f.name not in rest
    )
    _, hara = TrlParser((GRPOConfig, HaraConfig)).parse_args_and_config(
        base + ['--reweight', 'shear', '--reweight_kw', '{"width": 8}', '--hidden_layer', '1']
    )
    assert hara.reweight == 'shear' and hara.reweight_kw == {'width': 8}
    _, hara = TrlParser((GRPOConfig, HaraConfig)).parse_args_and_config(base + ['--span_len', '4'])
    assert hara.span_len == 4
    for bad, msg in (
        (['--clip', '0.7'], 'HaraConfig.clip must be two numbers (w_min, w_max), got [0.7]'),
        (['--L_b', '16', '--novelty_kw', '{"L_b": 8}'], "novelty_kw['L_b'] is the field"),
        (['--novelty_kw', '{"L_b": 8'], 'HaraConfig.novelty_kw must be a dict or a JSON object'),
    ):
        with pytest.raises(ValueError) as e:
            TrlParser((GRPOConfig, HaraConfig)).parse_args_and_config(base + bad)
        assert msg in str(e.value)


@pytest.mark.parametrize(
    'kw, msg',
    [
        (
            dict(reweight='shear', reweight_kw={'bogus': 1}),
            "HaraConfig.reweight_kw has an unknown option 'bogus' for reweight='shear': "
            "shear_weights takes ['plan_kw', 'reg', 'solver', 'stride', 'warn', 'width']",
        ),
        (
            dict(reweight='entropy', reweight_kw={'lam': 0.9}),
            "unknown option 'lam' for reweight='entropy': entropy_advantages takes ['rho']",
        ),
        (
            dict(reweight_kw={'rho': 0.1}),
            "HaraConfig.reweight_kw is not read with reweight='hara-tok'",
        ),
        (dict(reweight='none', reweight_kw={'rho': 0.2}), "reweight='none' takes no options"),
        (dict(novelty_kw={'bogus': 1}), "HaraConfig.novelty_kw has an unknown option 'bogus'"),
        (
            dict(novelty_kw=['L_b', 8]),
            "HaraConfig.novelty_kw must be a dict (a JSON object on the command line), got list",
        ),
        (
            dict(L_b=16, novelty_kw={'L_b': 8}),
            "HaraConfig.novelty_kw['L_b'] is the field HaraConfig.L_b (= 16): set it there, once",
        ),
        (dict(novelty_kw={'w_max': 3.0}), "novelty_kw['w_max'] is the field HaraConfig.clip"),
        (dict(novelty_kw={'outcomes': None}), "is passed by HaraGRPOTrainer itself"),
        (dict(reweight='shear', novelty_kw={'normalize': 'none'}), 'novelty_kw is not read'),
        (dict(reweight='position', L_b=16), "HaraConfig.L_b is an option of HARA"),
        (dict(span_len=2, span_sep_ids=[3]), 'HaraConfig.span_len and span_sep_ids both cut spans'),
        (dict(span_sep_ids=[-1]), 'token ids are >= 0'),
        (dict(span_sep_ids=[1.5]), 'span_sep_ids must hold integers or strings'),
        (dict(outcome_funcs=['a', 'a']), 'HaraConfig.outcome_funcs holds an entry twice'),
        (dict(outcome_threshold='high'), 'HaraConfig.outcome_threshold must be a finite real'),
    ],
)
def test_refused_configs_name_the_key(kw, msg):
    with pytest.raises((ValueError, TypeError)) as e:
        HaraConfig(**kw)
    assert msg in str(e.value)


def test_separator_texts_become_token_ids(tiny, tmp_path, capsys):
    """'\\n' is the one token the tokenizer makes of it; several tokens, or a text with no
    tokenizer, are refused."""
    tok = AutoTokenizer.from_pretrained(tiny)
    nl = tok.convert_tokens_to_ids('\n')
    tr = make(HaraGRPOTrainer, tiny, tmp_path, hara=HaraConfig(span_sep_ids='\n', novelty_kw=NOV))
    assert tr.hara.span_sep_ids == (nl,) and f'span_sep_ids=({nl},)' in capsys.readouterr().out
    with pytest.raises(
        ValueError, match=r"the tokenizer makes 2 tokens \[\d+, \d+\] of 'ab', not one"
    ):
        make(HaraGRPOTrainer, tiny, tmp_path, hara=HaraConfig(span_sep_ids=['ab']))
    with pytest.raises(ValueError, match="holds the text '\\\\n': a tokenizer turns it"):
        oracle_advantages(
            HaraConfig(span_sep_ids=['\n']),
            torch.randn(2, 3, 4),
            torch.ones(2, 3, dtype=torch.bool),
            torch.tensor([0.0, 1.0]),
            torch.zeros(2, dtype=torch.long),
            torch.tensor([-1.0, 1.0]),
            torch.zeros(2, 3, dtype=torch.long),
        )
    assert sep_token_ids(['\n', 5], tok) == (nl, 5)


def test_hara_config_saved_beside_training_args(tiny, tmp_path, capsys):
    hara = HaraConfig(novelty_kw=NOV, clip=[0.7, 1.5])
    tr = make(HaraGRPOTrainer, tiny, tmp_path, steps=1, hara=hara)
    assert (
        "HaraGRPOTrainer: HARA on: reweight='hara-tok', kappa=1.0, clip=(0.7, 1.5), novelty_kw="
        in capsys.readouterr().out
    )
    tr.train()
    assert HaraConfig(**json.loads((tmp_path / 'out' / 'hara_config.json').read_text())) == tr.hara
    tr.save_model(str(tmp_path / 'final'))
    saved = json.loads((tmp_path / 'final' / 'hara_config.json').read_text())
    assert (tmp_path / 'final' / 'training_args.bin').exists()
    assert saved['clip'] == [0.7, 1.5] and saved['outcome_funcs'] == ['parity']
    assert saved['novelty_kw'] == NOV and HaraConfig(**saved) == tr.hara


def test_example_script_runs_offline(tiny, tmp_path):
    """examples/grpo_hara.py as a user runs it: a tiny model, a JSONL file, GRPOConfig and
    HaraConfig from the command line; two steps."""
    data = tmp_path / 'train.jsonl'
    data.write_text(
        ''.join(
            json.dumps(dict(prompt=f'<bos>{a}+{b}=', answer=str(a + b))) + '\n'
            for a in range(10, 20)
            for b in range(10, 20)
        )
    )
    out = tmp_path / 'out'
    flags = dict(
        model_name_or_path=tiny,
        dataset_path=data,
        output_dir=out,
        max_steps=2,
        num_generations=4,
        per_device_train_batch_size=8,
        max_completion_length=4,
        logging_steps=1,
        save_strategy='no',
        report_to='none',
        use_cpu='true',
        bf16='false',
        disable_tqdm='true',
        seed=0,
        novelty_kw=json.dumps(NOV),
    )
    argv = [x for k, v in flags.items() for x in (f'--{k}', str(v))] + ['--clip', '0.7', '1.5']
    env = {**os.environ, 'HF_HUB_OFFLINE': '1', 'TRANSFORMERS_OFFLINE': '1', 'OMP_NUM_THREADS': '1'}
    r = subprocess.run(
        [sys.executable, str(ROOT / 'examples' / 'grpo_hara.py'), *argv],
        capture_output=True,
        text=True,
        timeout=300,
        env=env,
        cwd=tmp_path,
    )
    assert r.returncode == 0, r.stderr[-3000:]
    assert "outcome groups: the rollouts of one prompt with equal 'accuracy'" in r.stdout
    fracs = [float(x) for x in re.findall(r"'hara/reweighted_frac': '?([0-9.e-]+)", r.stdout)]
    assert len(fracs) == 2 and min(fracs) > 0  # the weights moved in both steps
    saved = json.loads((out / 'hara_config.json').read_text())
    assert saved['clip'] == [0.7, 1.5] and saved['outcome_funcs'] == ['accuracy']
    assert saved['novelty_kw'] == NOV
    assert (out / 'training_args.bin').exists() and (out / 'model.safetensors').exists()


# --- the TRL setups people run: tools, several passes per generation, LoRA, bf16 ---------------


def tool_rollouts(tool_text: str):
    """A `rollout_func` with a toy calculator: each completion is policy text, the tool's answer
    `tool_text` (env_mask 0: not the policy's), policy text. The policy's tokens depend only on the
    row and the step, so two runs that differ in `tool_text` only have the same policy tokens."""

    def rollout(prompts, trainer):
        tok = trainer.processing_class
        tool = tok(tool_text, add_special_tokens=False)['input_ids']
        out = dict(prompt_ids=[], completion_ids=[], logprobs=None, env_mask=[])
        for i, prompt in enumerate(prompts):
            g = torch.Generator().manual_seed(1000 * trainer.state.global_step + i)
            n1, n2 = torch.randint(2, 5, (2,), generator=g).tolist()
            own = torch.randint(4, len(tok), (n1 + n2,), generator=g).tolist()
            out['prompt_ids'].append(tok(prompt, add_special_tokens=False)['input_ids'])
            out['completion_ids'].append(own[:n1] + tool + own[n1:])
            out['env_mask'].append([1] * n1 + [0] * len(tool) + [1] * n2)
        return out

    return rollout


def first_tokens_parity(completion_ids, **kw):
    "A reward read off the first two tokens, which are always the policy's."
    return [float((c[0] + c[1]) % 2) for c in completion_ids]


def test_tool_results_never_enter_hara(tiny, tmp_path, monkeypatch):
    """Only the tool's answer differs between two runs: the advantages of every policy token are the
    same (hidden_layer=0: embeddings, so context cannot carry the tool text into them), tool-result
    tokens get weight 1, and the oracle saw the policy's tokens only, at their own positions."""
    monkeypatch.setenv('TRL_EXPERIMENTAL_SILENCE', '1')
    runs = []
    for text in ('=46', '=1234567'):
        tr = make(
            Recording,
            tiny,
            tmp_path,
            steps=1,
            reward_funcs=first_tokens_parity,
            rollout_func=tool_rollouts(text),
            hara=HaraConfig(hidden_layer=0, novelty_kw=NOV),
        )
        tr.train()
        runs.append(tr)
    own, adv = [], []
    for tr in runs:
        o = tr.out
        tool = o['completion_mask'].bool() & ~o['tool_mask'].bool()  # (b, T)
        assert tool.sum(1).min() > 0  # every completion called the tool
        # weight 1 on the tool's answer: TRL's advantage as it is
        A = tr.hara_record['reweighting'].base  # (b,)
        assert (o['advantages'] - A[:, None])[tool].abs().max() == 0
        m = o['completion_mask'].bool() & o['tool_mask'].bool()  # (b, T)
        own.append([c[r].tolist() for c, r in zip(o['completion_ids'], m)])
        adv.append([a[r] for a, r in zip(o['advantages'], m)])
    assert own[0] == own[1]  # the same policy tokens ...
    assert runs[0].out['completion_ids'].shape != runs[1].out['completion_ids'].shape
    # ... and the same advantages on each of them
    assert max((x - y).abs().max().item() for x, y in zip(*adv)) <= 1e-6
    assert any((x != x[:1]).any() for x in adv[0])  # token-level, not constant rows
    # the oracle's batch: the policy's tokens moved to the front (position t = t-th own token)
    o, rec = runs[0].out, runs[0].hara_record
    n = torch.tensor([len(x) for x in own[0]])  # (b,)
    mask = torch.arange(o['completion_ids'].shape[1]) < n[:, None]  # (b, T)
    ids = torch.zeros_like(o['completion_ids'])
    ids[mask] = torch.tensor(sum(own[0], []))
    emb = AutoModelForCausalLM.from_pretrained(tiny).get_input_embeddings()
    want, _ = hara_advantages(
        emb(ids).detach(),
        mask,
        rec['rewards'],
        rec['group_ids'],
        advantages=rec['reweighting'].base,
        **NOV,
    )
    assert max((want[i, : n[i]] - adv[0][i]).abs().max().item() for i in range(len(n))) <= 1e-6


def base_advantages(o, G=G):
    "Rewards, group ids and TRL's base advantages (scale_rewards='group') of a batch, recomputed."
    mask = o['completion_mask'].bool()  # (B, T)
    rewards = torch.tensor(parity([c[m].tolist() for c, m in zip(o['completion_ids'], mask)]))
    r = rewards.view(-1, G)
    base = ((r - r.mean(1, keepdim=True)) / (r.std(1, keepdim=True) + 1e-4)).flatten()
    return rewards, torch.arange(len(rewards)) // G, base


class Passes(HaraGRPOTrainer):
    """Keeps each generation batch with the hidden states HARA read and those of a plain forward,
    and the advantages every `_compute_loss` call receives."""

    def _hara_advantages(self, out, hidden, entropy):
        ids = [out[k] for k in ('prompt_ids', 'prompt_mask', 'completion_ids', 'completion_mask')]
        plain = completion_hidden(self.model, *ids, layer=self.hara.hidden_layer)  # (B, T, d)
        adv = super()._hara_advantages(out, hidden, entropy)
        self.gens = getattr(self, 'gens', []) + [dict(out=dict(out), hidden=hidden, plain=plain)]
        self.gens[-1]['adv'] = adv
        return adv

    def _compute_loss(self, model, inputs):
        self.received = getattr(self, 'received', []) + [inputs['advantages'].detach().clone()]
        return super()._compute_loss(model, inputs)


# (num_iterations, steps_per_generation, gradient_accumulation_steps); (1, 1, 1) is the tests above
PASSES = [(2, 1, 1), (1, 2, 1), (1, 2, 2), (2, 2, 2)]


@pytest.mark.parametrize('ni, spg, gas', PASSES)
def test_several_passes_per_generation(tiny, tmp_path, ni, spg, gas):
    """HARA's (B, T) advantages are computed once per generation batch, over its whole groups, equal
    a direct `hara_advantages` call on it and reach every pass; kappa=0 trains as stock TRL."""
    every = ni * spg  # micro-steps per generation
    steps = every // gas  # one generation batch, every pass over it
    kw = dict(num_iterations=ni, steps_per_generation=spg, gradient_accumulation_steps=gas)
    tr = make(Passes, tiny, tmp_path, steps=steps, args_kw=kw, hara=HaraConfig(novelty_kw=NOV))
    tr.train()
    assert len(tr.gens) == 1 and len(tr.received) == every
    for j, gen in enumerate(tr.gens):
        o, mask = gen['out'], gen['out']['completion_mask'].bool()
        assert len(mask) == 8 * spg  # the whole generation batch, not a micro-batch
        tol = rounding_tol(gen['plain'].abs().max(), n=tr.model.config.intermediate_size)
        assert (gen['hidden'] - gen['plain'])[mask].abs().max() <= tol
        rewards, gid, base = base_advantages(o)
        want, _ = hara_advantages(
            gen['hidden'], mask, rewards, gid, granularity='tok', advantages=base, **NOV
        )
        assert (gen['adv'] - want).abs().max() <= 1e-6
        # every pass and slice reads these advantages: TRL only shuffles and splits the rows
        got = torch.cat(tr.received[j * every : (j + 1) * every])  # (ni B, T)
        assert torch.equal(
            torch.sort(got.flatten()).values, torch.sort(gen['adv'].repeat(ni, 1).flatten()).values
        )
    stock = make(GRPOTrainer, tiny, tmp_path, steps=steps, args_kw=kw)
    stock.train()
    k0 = make(HaraGRPOTrainer, tiny, tmp_path, steps=steps, args_kw=kw, hara=HaraConfig(kappa=0.0))
    k0.train()
    assert (flat_params(stock.model) - flat_params(k0.model)).abs().max() <= 1e-6


def counting(cls):
    "`cls` that counts forwards of the model's backbone outside generation."

    class Counting(cls):
        def train(self, *a, **kw):
            self.forwards, self._generating = 0, False

            def count(module, args, output):
                self.forwards += not self._generating

            hook = self.model.get_decoder().register_forward_hook(count)
            try:
                return super().train(*a, **kw)
            finally:
                hook.remove()

        def _generate(self, prompts):
            self._generating = True
            try:
                return super()._generate(prompts)
            finally:
                self._generating = False

    return Counting


@pytest.mark.parametrize('ni', [1, 2])
def test_hara_reads_trls_scoring_forward(tiny, tmp_path, ni):
    """Forwards per generation batch outside generation: HARA adds one only when TRL scores no old
    policy (num_iterations=1, on-policy); with num_iterations=2 it reads TRL's scoring forward."""
    kw = dict(num_iterations=ni)
    stock = make(counting(GRPOTrainer), tiny, tmp_path, steps=ni, args_kw=kw)
    stock.train()
    ours = make(
        counting(HaraGRPOTrainer),
        tiny,
        tmp_path,
        steps=ni,
        args_kw=kw,
        hara=HaraConfig(novelty_kw=NOV),
    )
    ours.train()
    # stock: one loss forward per step, plus TRL's old-policy scoring when ni > 1
    assert stock.forwards == ni + (ni > 1)
    assert ours.forwards == stock.forwards + (ni == 1)


def lora():
    from peft import LoraConfig

    return LoraConfig(r=4, lora_alpha=8, target_modules=['q_proj', 'v_proj', 'up_proj'])


def adapter_params(model):
    return torch.cat([p.detach().flatten() for n, p in model.named_parameters() if 'lora_' in n])


def test_lora_kappa0_equals_stock(tiny, tmp_path):
    pytest.importorskip('peft')
    stock = make(GRPOTrainer, tiny, tmp_path, steps=2, peft_config=lora())
    stock.train()
    ours = make(
        HaraGRPOTrainer, tiny, tmp_path, steps=2, peft_config=lora(), hara=HaraConfig(kappa=0.0)
    )
    ours.train()
    a, b = adapter_params(stock.model), adapter_params(ours.model)
    lora_B = torch.cat([p.flatten() for n, p in ours.model.named_parameters() if 'lora_B' in n])
    assert lora_B.abs().max() > 1e-4  # the adapter trained (lora_B starts at 0) ...
    assert (a - b).abs().max() <= 1e-6  # ... exactly as stock TRL's


class LoraHidden(HaraGRPOTrainer):
    "Keeps the hidden states HARA read with those of the merged model and of the base model."

    def _hara_advantages(self, out, hidden, entropy):
        ids = [out[k] for k in ('prompt_ids', 'prompt_mask', 'completion_ids', 'completion_mask')]
        merged = copy.deepcopy(self.model).merge_and_unload()
        with self.model.disable_adapter():
            base = completion_hidden(self.model, *ids)  # (B, T, d)
        self.seen = dict(hidden=hidden, merged=completion_hidden(merged, *ids), base=base)
        self.seen['mask'] = out['completion_mask'].bool()
        return super()._hara_advantages(out, hidden, entropy)


@pytest.mark.parametrize('ni', [1, 2])
def test_lora_hara_reads_the_adapted_model(tiny, tmp_path, ni):
    """kappa=1 with a LoRA adapter trains, and the hidden states HARA reads (its own forward, or
    TRL's scoring forward with num_iterations=2) are the adapted model's: a direct forward of the
    merged model, not of the base model."""
    pytest.importorskip('peft')
    tr = make(
        LoraHidden,
        tiny,
        tmp_path,
        steps=2 * ni,  # the second generation batch sees a trained adapter
        peft_config=lora(),
        args_kw=dict(num_iterations=ni),
        hara=HaraConfig(novelty_kw=NOV),
    )
    start = adapter_params(tr.model)
    tr.train()
    assert (adapter_params(tr.model) - start).abs().max() > 1e-4
    s, m = tr.seen, tr.seen['mask']
    tol = rounding_tol(s['merged'].abs().max(), n=tr.model.config.intermediate_size)
    assert (s['hidden'] - s['merged'])[m].abs().max() <= tol
    assert (s['hidden'] - s['base'])[m].abs().max() > 10 * tol


def test_bf16_autocast(tiny, tmp_path):
    """Under bf16 autocast on CPU: HARA reads its hidden states in float32, and kappa=0 trains as
    stock TRL does under the same autocast."""
    kw = dict(bf16=True)
    tr = make(Recording, tiny, tmp_path, steps=1, args_kw=kw, hara=HaraConfig(novelty_kw=NOV))
    tr.train()
    assert tr.hidden.dtype == torch.float32
    # the tiny model's residual stream stays float32 under autocast; a bfloat16 model's does not
    net = AutoModelForCausalLM.from_pretrained(tiny, dtype=torch.bfloat16)
    ids = torch.tensor([[5, 6, 7, 8]])  # (1, P+T)
    one = torch.ones_like(ids[:, :2])  # (1, 2)
    assert completion_hidden(net, ids[:, :2], one, ids[:, 2:], one).dtype == torch.float32
    assert tr.hara_record['reweighting'].weights.dtype == torch.float32
    stock = make(GRPOTrainer, tiny, tmp_path, steps=2, args_kw=kw)
    stock.train()
    k0 = make(HaraGRPOTrainer, tiny, tmp_path, steps=2, args_kw=kw, hara=HaraConfig(kappa=0.0))
    k0.train()
    start = flat_params(AutoModelForCausalLM.from_pretrained(tiny))
    assert (flat_params(stock.model) - start).abs().max() > 1e-4
    assert (flat_params(stock.model) - flat_params(k0.model)).abs().max() <= 1e-6
