"""HaraGRPOTrainer's outcomes and warnings, and the TRL command lines: the outcome from the values
the reward functions return, a warning on every step that matters (not once per run), text
separators, and usage errors before any work (the example script, `hara-ref train --engine trl`)."""

import ast
import os
import subprocess
import sys
import textwrap
import warnings
import pytest
import torch

trl = pytest.importorskip('trl')
from transformers import AutoTokenizer  # noqa: E402
from hara_ref.practice.cli import train_cli  # noqa: E402
from hara_ref.practice.trl import HaraGRPOTrainer  # noqa: E402
from hara_ref.practice.trl_config import HaraConfig  # noqa: E402
from hara_ref.train.policy import char_tokenizer, tiny_qwen3  # noqa: E402
from hara_ref.trainer.loop import save_policy  # noqa: E402
from test_trl import NOV, ROOT, G, Recording, make, parity  # noqa: E402


@pytest.fixture(scope='module')
def tiny(tmp_path_factory):
    "A tiny random Qwen3 with the character tokenizer, saved to a local folder."
    path = tmp_path_factory.mktemp('trl_outcomes') / 'tiny'
    tok = char_tokenizer()
    save_policy(tiny_qwen3(tok, hidden_size=32, seed=0), tok, path)
    return path


ENV = {**os.environ, 'HF_HUB_OFFLINE': '1', 'TRANSFORMERS_OFFLINE': '1', 'OMP_NUM_THREADS': '1'}


def style(completion_ids, **kw):
    "A graded score: no two rollouts share it."
    return [0.01 * sum(c) / max(len(c), 1) + 1e-6 * len(c) for c in completion_ids]


def test_outcome_threshold_reads_the_unweighted_reward(tiny, tmp_path, capsys):
    """reward_weights [0.5, 1] and outcome_threshold=1.0 on `parity`: the outcome is parity itself
    (before: 0.5 * 1 < 1, every rollout outcome 0, correct and wrong in one group), and the startup
    line says the outcome is unweighted and names the weight."""
    tr = make(
        Recording,
        tiny,
        tmp_path,
        steps=1,
        reward_funcs=[parity, style],
        args_kw=dict(reward_weights=[0.5, 1.0]),
        hara=HaraConfig(outcome_funcs=['parity'], outcome_threshold=1.0, novelty_kw=NOV),
    )
    line = capsys.readouterr().out
    assert (
        "'parity' >= 1.0 (1) or not (0), as the function returns it (unweighted: TRL's "
        "reward_weights ('parity' 0.5) scale the reward only)"
    ) in line
    tr.train()
    rpf = tr._hara_rewards_per_func  # (B, F) as the functions returned them
    out = tr.hara_record['outcomes']
    assert out.tolist() == rpf[:, 0].tolist() and 0 < out.sum() < len(out)  # both outcomes
    assert torch.allclose(tr.hara_record['rewards'], 0.5 * rpf[:, 0] + rpf[:, 1])


class Switching:
    """A reward that is 0 for every rollout in the first `quiet` generation batches (every advantage
    0), then a graded score (every rollout alone in its outcome group)."""

    def __init__(self, quiet: int):
        self.quiet, self.calls, self.__name__ = quiet, 0, 'switching'

    def __call__(self, completion_ids, **kw):
        self.calls += 1
        return [0.0] * len(completion_ids) if self.calls <= self.quiet else style(completion_ids)


def run_warned(tiny, tmp, reward, steps, **hara):
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter('always')
        tr = make(
            Recording,
            tiny,
            tmp,
            steps=steps,
            reward_funcs=reward,
            hara=HaraConfig(novelty_kw=NOV, **hara),
        )
        tr.train()
    fracs = [h['hara/reweighted_frac'] for h in tr.state.log_history if 'hara/weight_mean' in h]
    return tr, [str(w.message) for w in caught if 'HARA reweighted none' in str(w.message)], fracs


def test_a_harmless_step_does_not_spend_the_warning(tiny, tmp_path):
    """Step 1: every advantage 0 (nothing to reweight: no warning, and reweighted_frac has no
    denominator); steps 2-6: every rollout alone. The warning comes at the 1st, 2nd and 4th such
    step (steps 2, 3, 5), with the counts (before: once, at step 1, with advice that did not
    apply, and never again)."""
    tr, warned, fracs = run_warned(tiny, tmp_path, Switching(quiet=1), steps=6)
    assert fracs == [None, 0.0, 0.0, 0.0, 0.0, 0.0]  # NaN in step 1: TRL's log gives None
    assert len(warned) == 3 and tr._hara_idle == 5
    for step, k, msg in zip((2, 3, 5), (1, 2, 4), warned):
        assert msg.startswith(
            f"HaraGRPOTrainer: HARA reweighted none of the 8 rollouts whose advantage is not 0 in "
            f"step {step} (steps like this so far: {k}; this warning comes again when they reach "
            f"{2 * k}): 8 of them are alone in their outcome group. An outcome group is the "
            "rollouts of one prompt with the same outcome, here 'switching'"
        )
        assert 'HaraConfig.outcome_funcs' in msg and 'HaraConfig.outcome_threshold' in msg


def test_steps_with_every_advantage_zero_never_warn(tiny, tmp_path):
    tr, warned, fracs = run_warned(tiny, tmp_path, Switching(quiet=3), steps=3)
    assert warned == [] and fracs == [None] * 3 and tr._hara_idle == 0


def half_mixed(completion_ids, **kw):
    "The first prompt's rollouts all 0 (A = 0), the second's 0, 1, 0, 1: two outcome groups of 2."
    return [0.0 if i < G else float(i % 2) for i in range(len(completion_ids))]


def test_reweighted_frac_counts_among_rollouts_whose_advantage_is_not_0(tiny, tmp_path):
    """One prompt has A = 0 on every rollout; reweighted_frac is over the others, all of which
    moved: 1 (before: 4 of 8, 0.5, as if half the rollouts HARA could reweight were not)."""
    tr, warned, fracs = run_warned(tiny, tmp_path, half_mixed, steps=1)
    base = tr.hara_record['reweighting'].base  # (B,)
    moved = (tr.hara_record['weights'] != 1).any(1)  # (B,)
    assert warned == [] and (base[:G] == 0).all() and (base[G:] != 0).all()
    assert moved[G:].all() and fracs == [1.0]


def test_two_text_separators_build_the_trainer(tiny, tmp_path, capsys):
    "Before: the pre-flight check made both texts id 0 and refused '[0, 0]'."
    tok = AutoTokenizer.from_pretrained(tiny)
    ids = tuple(tok.convert_tokens_to_ids(s) for s in ('\n', '+'))
    tr = make(HaraGRPOTrainer, tiny, tmp_path, hara=HaraConfig(span_sep_ids=['\n', '+']))
    assert tr.hara.span_sep_ids == ids and f'span_sep_ids={ids}' in capsys.readouterr().out


# --- the command lines: usage errors before any work ----------------------------------------------


def test_example_script_refuses_a_bad_value_with_exit_code_2(tiny, tmp_path):
    """`--metric cosine` (and a solver value the oracle refuses): exit code 2, one error line naming
    the field, nothing written (before: a traceback and exit code 1)."""
    out = tmp_path / 'out'
    base = [sys.executable, str(ROOT / 'examples' / 'grpo_hara.py'), '--model_name_or_path']
    base += [str(tiny), '--dataset_path', 'none.jsonl', '--output_dir', str(out)]
    base += ['--use_cpu', 'true', '--bf16', 'false', '--report_to', 'none']
    for bad, msg in (
        (['--metric', 'cosine'], "HaraConfig.metric must be 'fgw', 'w', 'gw' or 'embed'"),
        (['--novelty_kw', '{"bary_kw": {"inner_iter": 0}}'], 'HaraConfig.novelty_kw: '),
    ):
        r = subprocess.run(base + bad, capture_output=True, text=True, env=ENV, timeout=300)
        errors = [line for line in r.stderr.splitlines() if 'error' in line]
        assert r.returncode == 2 and errors == [r.stderr.splitlines()[-1]], r.stderr[-2000:]
        assert errors[0].startswith(f'grpo_hara.py: error: {msg}') and not out.exists()


def test_example_header_builds_a_tiny_offline_model_and_runs_on_a_cpu(tmp_path):
    "The commands of the script's header, as written there (dedented), in an empty folder."
    doc = ast.get_docstring(ast.parse((ROOT / 'examples' / 'grpo_hara.py').read_text()))
    block = textwrap.dedent(doc[doc.index("    python - <<'EOF'") :])
    assert '--use_cpu true' in block and '--bf16 false' in block
    script = block.replace('python examples/', f'{sys.executable} {ROOT}/examples/')
    script = script.replace('python -', f'{sys.executable} -')
    r = subprocess.run(
        ['bash', '-c', script], capture_output=True, text=True, env=ENV, timeout=600, cwd=tmp_path
    )
    assert r.returncode == 0, r.stderr[-3000:]
    assert "outcome groups: the rollouts of one prompt with equal 'accuracy'" in r.stdout
    run = tmp_path / 'runs' / 'tiny'
    assert (run / 'model.safetensors').exists() and (run / 'hara_config.json').exists()


def test_engine_trl_checks_every_variant_before_any_work(tmp_path, capsys, monkeypatch):
    """A variant's HaraConfig that the oracle refuses: exit code 2 and one line before the warm
    start, nothing written (before: the warm start ran, then the run failed with a traceback)."""
    from hara_ref.practice import trl_train

    def refused(cfg):
        if cfg.reweight == 'none':
            return HaraConfig(reweight='none')
        return HaraConfig(novelty_kw=dict(bary_kw=dict(max_iter=0)))

    monkeypatch.setattr(trl_train, 'hara_config_of', refused)
    out = tmp_path / 'r'
    argv = ['--engine', 'trl', '--out', str(out), '--seeds', '1', '--steps', '1']
    argv += ['--sft-steps', '1', '--reweight', 'hara-tok', '--hidden-size', '32']
    assert train_cli(argv) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith(
        'hara-ref train: error: --engine trl: HaraConfig.novelty_kw: '
    )
    assert not out.exists() or not any(out.iterdir())


def test_the_trainer_checks_the_users_own_values_again():
    """A config changed after it was made: the trainer's check (the oracle's dry run) sees the
    user's cap, before TRL loads anything (before: the dry run replaced it with its own)."""
    cfg = HaraConfig(novelty_kw=dict(bary_kw=dict(max_iter=50)))
    cfg.novelty_kw['bary_kw']['max_iter'] = 0
    with pytest.raises(ValueError, match=r'^HaraConfig\.novelty_kw: .*max_iter'):
        HaraGRPOTrainer(model=None, hara=cfg)
