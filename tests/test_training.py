"""Training loop pieces: tokenizer and model round trips, scoring, the fixed-batch learning check,
resume, bad config."""

import json
import os
import platform
import warnings
import pytest
import torch

os.environ.setdefault('HF_HUB_OFFLINE', '1')
os.environ.setdefault('TRANSFORMERS_OFFLINE', '1')
from hara_ref.train.policy import (
    char_tokenizer,
    tiny_qwen3,
    encode_prompts,
    sample,
    policy_forward,
    pad_id,
)
from hara_ref.trainer.step import TrainConfig, credit_advantages, ppo_update
from hara_ref.trainer.loop import (
    train_run,
    save_policy,
    load_policy,
    read_jsonl,
    load_trainer_state,
)
from hara_ref.train.sft import builtin_items, evaluate, sft
from hara_ref.practice.cli import train_cli
from hara_ref.engine.verifier import rounding_tol
from hara_ref.rlvr.basics import exact_match_reward

torch.set_num_threads(1)


@pytest.fixture(scope='module')
def tok():
    return char_tokenizer()


def test_tokenizer_and_model_round_trip(tok, tmp_path):
    from transformers import AutoTokenizer, AutoModelForCausalLM

    m = tiny_qwen3(tok, hidden_size=32, seed=3)
    save_policy(m, tok, tmp_path / 'p')
    t2 = AutoTokenizer.from_pretrained(tmp_path / 'p', local_files_only=True)
    m2 = AutoModelForCausalLM.from_pretrained(tmp_path / 'p', local_files_only=True)
    s = '12+30+7=;12+7=19;\\boxed{49}'
    assert t2(s)['input_ids'] == tok(s)['input_ids'] and t2.decode(t2(s)['input_ids']) == s
    assert type(m2).__name__ == 'Qwen3ForCausalLM'
    assert all(torch.equal(p, q) for p, q in zip(m.state_dict().values(), m2.state_dict().values()))
    assert not (tmp_path / 'p.tmp').exists() and not (tmp_path / 'p.old').exists()


def test_sampling_and_scoring_agree(tok):
    m = tiny_qwen3(tok, hidden_size=32, seed=0).eval()
    pi, pm = encode_prompts(tok, ['1+2=', '10+20+30=', '5='])
    ri, rm = sample(
        m, pi, pm, 10, tok.eos_token_id, pad_id(tok), generator=torch.Generator().manual_seed(1)
    )
    lp, ent, h = policy_forward(m, pi, pm, ri, rm, hidden_layer=-1)
    assert h.shape == (3, ri.shape[1], 32) and torch.isfinite(lp[rm]).all()
    for b in range(3):  # a padded row scores like the row alone
        L = int(rm[b].sum())
        x = torch.cat([pi[b][pm[b]], ri[b][:L]])[None]
        ref = torch.log_softmax(m(input_ids=x).logits[0, -L - 1 : -1], -1).gather(
            -1, ri[b][:L, None]
        )[:, 0]
        torch.testing.assert_close(lp[b, :L], ref, atol=1e-4, rtol=1e-4)
    # greedy decoding equals transformers' generate on the same prompts
    g, gm = sample(m, pi, pm, 10, tok.eos_token_id, pad_id(tok), temperature=0)
    out = m.generate(
        input_ids=pi,
        attention_mask=pm.long(),
        max_new_tokens=10,
        do_sample=False,
        pad_token_id=pad_id(tok),
        eos_token_id=tok.eos_token_id,
    )
    gen = out[:, pi.shape[1] :]
    n = min(gen.shape[1], g.shape[1])
    assert torch.equal(torch.where(gm[:, :n], g[:, :n], -1), torch.where(gm[:, :n], gen[:, :n], -1))


@pytest.mark.parametrize('reweight', ['none', 'hara-tok', 'hara-seq'])
def test_fixed_batch_raises_rewarded_lowers_others(tok, reweight):
    """A few PPO updates on one fixed batch raise log pi(o|q) of rewarded rollouts and lower it for
    the others."""
    m = tiny_qwen3(tok, hidden_size=32, seed=1)
    cfg = TrainConfig(reweight=reweight, lr=1e-3, ppo_epochs=1, minibatches=1)
    pi, pm = encode_prompts(tok, ['1+2=', '3+4='] * 4)
    gid = torch.tensor([0, 1] * 4)
    ri, rm = sample(
        m, pi, pm, 8, tok.eos_token_id, pad_id(tok), generator=torch.Generator().manual_seed(0)
    )
    r = torch.tensor([1.0, 0, 0, 1, 1, 0, 0, 1])
    with torch.no_grad():
        old, ent, h = policy_forward(m, pi, pm, ri, rm, -1)
    with warnings.catch_warnings():
        warnings.simplefilter('ignore')
        A, stats = credit_advantages(cfg, h, rm, r, gid, ent)
    assert A.shape == rm.shape and ((A > 0) == (r[:, None] > 0).expand_as(A) & rm).all()
    opt = torch.optim.AdamW(m.parameters(), lr=cfg.lr)
    for _ in range(4):
        ppo_update(
            m,
            opt,
            pi,
            pm,
            ri,
            rm,
            old,
            A,
            torch.ones(8, dtype=torch.bool),
            cfg,
            torch.Generator().manual_seed(0),
        )
    with torch.no_grad():
        new = policy_forward(m, pi, pm, ri, rm)[0]
    d = ((new - old) * rm).sum(1)
    assert (d[r == 1] > 0).all() and (d[r == 0] < 0).all(), d


def _even_length_reward(text, answer):
    return float(len(text) % 2 == 0)


def _tiny_run(tmp_path, tok, steps, resume=False, reweight='hara-tok', name='run', allow=False):
    init = tmp_path / 'init'
    if not init.exists():
        save_policy(tiny_qwen3(tok, hidden_size=32, seed=0), tok, init)
    items = builtin_items(16, 'train', max_value=9)
    cfg = TrainConfig(
        reweight=reweight,
        steps=steps,
        group_size=4,
        prompts_per_step=2,
        max_new_tokens=8,
        eval_every=2,
        eval_prompts=4,
        eval_samples=2,
        lr=1e-3,
        seed=7,
    )
    with warnings.catch_warnings():
        warnings.simplefilter('ignore')
        return train_run(
            cfg,
            tmp_path / name,
            init,
            items,
            items[:4],
            _even_length_reward,
            resume=resume,
            progress=False,
            allow_config_change=allow,
        )


def test_resume_matches_uninterrupted_run(tok, tmp_path):
    full = _tiny_run(tmp_path, tok, 4, name='full')
    _tiny_run(tmp_path, tok, 2, name='split')
    assert load_trainer_state(tmp_path / 'split')['step'] == 2
    resumed = _tiny_run(tmp_path, tok, 4, resume=True, name='split', allow=True)  # 2 steps more
    strip = lambda rows: [{k: v for k, v in r.items() if not k.startswith('t_')} for r in rows]
    assert strip(full) == strip(resumed)
    assert [r['kind'] for r in full] == ['eval', 'train', 'train', 'eval', 'train', 'train', 'eval']
    a = load_policy(tmp_path / 'full' / 'final')[0].state_dict()
    b = load_policy(tmp_path / 'split' / 'final')[0].state_dict()
    assert all(torch.equal(a[k], b[k]) for k in a)
    # the reward gave signal: updates happened
    assert any(r['kind'] == 'train' and r['zero_std_frac'] < 1 for r in full)


def test_killed_run_loses_at_most_a_step(tok, tmp_path):
    _tiny_run(tmp_path, tok, 3, reweight='none', name='k')
    d = tmp_path / 'k'
    # torn line of a killed write
    with open(d / 'metrics.jsonl', 'a') as f:
        f.write('{"kind": "train", "step": 4, "tor')
    os.replace(d / 'ckpt', d / 'ckpt.old')  # killed between the two renames of a checkpoint swap
    st = load_trainer_state(d)
    assert st['step'] == 3 and st['path'].name == 'ckpt.old'
    rows = read_jsonl(d / 'metrics.jsonl')
    assert [r['step'] for r in rows if r['kind'] == 'train'] == [1, 2, 3]
    rows = _tiny_run(tmp_path, tok, 4, resume=True, reweight='none', name='k', allow=True)
    assert [r['step'] for r in rows if r['kind'] == 'train'] == [1, 2, 3, 4]


def test_seeded_runs_reproducible(tok, tmp_path):
    a = _tiny_run(tmp_path, tok, 2, reweight='none', name='a')
    b = _tiny_run(tmp_path, tok, 2, reweight='none', name='b')
    strip = lambda rows: [{k: v for k, v in r.items() if not k.startswith('t_')} for r in rows]
    assert strip(a) == strip(b)


@pytest.mark.parametrize(
    'argv,msg',
    [
        (['--method', 'ppo'], 'unknown --method'),
        (['--reweight', 'hara-tok,nope'], 'unknown --reweight'),
        (['--group-size', '1'], '--group-size must be >= 2'),
        (['--model', '/no/such/model'], 'no checkpoint'),
        (['--model', 'MODEL', '--data', 'EMPTY'], 'is empty'),
        (['--model', 'MODEL', '--data', '/no/such/file.jsonl'], 'does not exist'),
        (['--resume'], '--resume needs --out'),
        (['--seeds', 'a,b'], '--seeds'),
        (['--data', 'DATA'], '--data needs --model, a local checkpoint'),  # nothing to learn
        (['--allow-config-change'], '--allow-config-change only applies with --resume'),
    ],
)
def test_bad_config_fails_before_any_work(tmp_path, capsys, argv, msg):
    (tmp_path / 'empty.jsonl').write_text('\n\n')
    (tmp_path / 'data.jsonl').write_text('{"problem": "1+1?", "answer": 2}\n')
    ctok = char_tokenizer()
    if 'MODEL' in argv:
        save_policy(tiny_qwen3(ctok, hidden_size=32), ctok, tmp_path / 'm')
    paths = dict(EMPTY=tmp_path / 'empty.jsonl', DATA=tmp_path / 'data.jsonl', MODEL=tmp_path / 'm')
    argv = [str(paths[a]) if a in paths else a for a in argv]
    out = tmp_path / 'out'
    assert train_cli(argv + (['--out', str(out)] if '--resume' not in argv else [])) == 2
    assert msg in capsys.readouterr().err
    assert not out.exists()  # nothing was written


def test_sft_learns_the_format(tok):
    torch.manual_seed(0)
    m = tiny_qwen3(tok, hidden_size=32)
    items = builtin_items(200, 'train', max_value=9)
    losses = sft(m, tok, [it['problem'] for it in items], steps=150, batch_size=32, lr=5e-3)
    assert losses[-1] < 0.5 * losses[0]
    ev = evaluate(m, tok, items[:8], exact_match_reward, n_samples=2, max_new_tokens=24)
    assert 0 <= ev['pass1'] <= ev['passk'] <= 1 and ev['length'] > 0


@pytest.mark.skipif(
    platform.system() != 'Linux' or platform.libc_ver()[0] != 'glibc',
    reason='peak_rss_mib reads ru_maxrss in KiB and sets glibc malloc',
)
def test_chunked_scoring_keeps_peak_memory_down_at_qwen3_vocab():
    """Chapter 53's peak-memory probe: at Qwen3's vocabulary, scoring 4 x 64 tokens in chunks of 32
    grows the peak RSS by under half of one copy of the full (B, T, V) float32 logits (the
    unchunked call holds at least one)."""
    from hara_ref.bench.scale import peak_rss_mib

    one_copy = 4 * 64 * 151_936 * 4 / 2**20  # MiB
    assert peak_rss_mib(4, 64, chunk_tokens=32) < one_copy / 2


def test_committed_memory_table_backs_chapter_36():
    """Chapter 53 prints its memory numbers from `results/memory.json`, and says what they show: the
    chunked peak stays near one chunk's few (256, V) tensors while the unchunked one grows with
    B x T (16 x 128: over 8 times the chunked peak)."""
    from pathlib import Path

    mem = json.loads((Path(__file__).parent.parent / 'nbs/results/memory.json').read_text())
    rows = mem['tables'][0]['rows']  # B × T, gradients, unchunked MiB, chunked MiB
    mib = lambda s: float(s.replace(',', ''))
    chunked = [mib(r[3]) for r in rows]
    assert max(chunked) < 2 * min(chunked)  # whatever B and T are
    big = [r for r in rows if r[0] == '16 × 128']
    assert big and all(mib(r[2]) > 8 * mib(r[3]) for r in big)


def test_hara_share_in_train_results_is_what_18_and_the_front_page_read():
    "Chapter 44 and the front page read HARA's share of a step from `results/train.json`."
    from pathlib import Path

    root = Path(__file__).parent.parent
    train = json.loads((root / 'nbs/results/train.json').read_text())
    row = next(r for r in train['tables'][0]['rows'] if r[0] == 'grpo+hara-tok')
    share = row[-1]  # e.g. '46 ± 1 %'
    assert share.endswith('%') and 0 < float(share.split()[0]) < 100
    assert f"HARA's own computation is {share} of its step" in (root / 'README.md').read_text()


@pytest.mark.float32
@pytest.mark.parametrize('chunk', [1, 7, 64, 4096])
def test_chunked_scoring_equals_unchunked_at_qwen3_vocab(tok, chunk):
    """At V = 151,936 the chunked log-probs, entropies and their gradients equal the model's own (B,
    T, V) logits'."""
    m = tiny_qwen3(tok, hidden_size=16, n_heads=2, n_kv_heads=1, seed=2, vocab_size=151_936)
    pi, pm = encode_prompts(tok, ['1+2=', '10+20+30='])
    g = torch.Generator().manual_seed(0)
    ri = torch.randint(0, 151_936, (2, 9), generator=g)
    rm = torch.ones(2, 9, dtype=torch.bool)
    rm[1, 6:] = False
    grads = {}
    for c in (None, chunk):
        m.zero_grad()
        lp, ent, h = policy_forward(m, pi, pm, ri, rm, hidden_layer=-1, chunk_tokens=c)
        (lp[rm].sum() + ent[rm].sum()).backward()
        grads[c] = (lp.detach(), ent.detach(), h.detach(), m.model.embed_tokens.weight.grad.clone())
    # the longest sums: softmax over V, the MLP's down-projection
    n = 151_936 + m.config.intermediate_size
    for a, b in zip(grads[None][:3], grads[chunk][:3]):
        torch.testing.assert_close(b, a, atol=rounding_tol(a.abs().max(), n=n), rtol=0)
    g0, g1 = grads[None][3], grads[chunk][3]  # float32 sums over V = 151,936 terms in another order
    assert (g1 - g0).abs().max() <= rounding_tol(g0.abs().max(), n=n), (
        (g1 - g0).abs().max(),
        g0.abs().max(),
    )
    assert bool(
        (
            (grads[chunk][1] >= 0) & (grads[chunk][1] <= torch.log(torch.tensor(151_936.0)) + 1e-4)
        ).all()
    )


def test_train_flags_come_from_the_configs():
    from hara_ref.practice.cli import train_parser
    from hara_ref.trainer.step import TrainConfig
    from hara_ref.trainer.experiment import ExperimentConfig

    p = train_parser()
    assert (
        p.get_default('lr') == TrainConfig.lr
        and p.get_default('hidden_size') == ExperimentConfig.hidden_size
    )
    assert (
        p.get_default('layers') == ExperimentConfig.n_layers
        and p.get_default('reweight') == ExperimentConfig.reweights
    )
    assert (
        p.get_default('clip_eps_high') is None and TrainConfig(method='dapo').clip_eps_high == 0.28
    )
    for flag in (
        '--gradient-checkpointing',
        '--L-b',
        '-G',
        '--engine',
        '--first-wave',
        '--sft-shuffle',
        '--overlong-cache',
    ):
        assert flag in p._option_string_actions, flag
    assert train_cli(['--dtype', 'fp8']) == 2


# Data files: read right, or refused with file, line and field.


def _data(tmp_path, *lines, bom=False):
    f = tmp_path / 'data.jsonl'
    f.write_bytes((b'\xef\xbb\xbf' if bom else b'') + ''.join(l + '\n' for l in lines).encode())
    return f


def test_load_jsonl_answer_zero_is_an_answer(tmp_path):
    from hara_ref.train.sft import load_jsonl

    f = _data(
        tmp_path,
        '{"problem": "1-1?", "answer": 0, "solution": "\\\\boxed{7}"}',
        '{"problem": "2-2?", "answer": "0"}',
    )
    assert [it['answer'] for it in load_jsonl(f)] == ['0', '0']


def test_load_jsonl_reads_a_byte_order_mark(tmp_path):
    from hara_ref.train.sft import load_jsonl

    f = _data(tmp_path, '{"problem": "1+1?", "answer": 2}', bom=True)
    assert load_jsonl(f)[0]['answer'] == '2'


NO_ANSWER = "data.jsonl:2: field 'answer' is missing (or null)"


@pytest.mark.parametrize(
    'line, msg',
    [
        ('{"problem": null, "answer": "1"}', "data.jsonl:2: field 'problem' is missing"),
        ('{"answer": "1"}', "data.jsonl:2: field 'problem' is missing"),
        (
            '{"problem": 12, "answer": "1"}',
            "data.jsonl:2: field 'problem' must be a non-empty string",
        ),
        (
            '{"problem": "", "answer": "1"}',
            "data.jsonl:2: field 'problem' must be a non-empty string",
        ),
        ('{"problem": "x", "answer": null}', f"{NO_ANSWER} and there is no 'solution'"),
        ('{"problem": "x", "solution": "no box here"}', f"{NO_ANSWER} and field 'solution' has no"),
        (
            '{"problem": "x", "answer": ""}',
            "data.jsonl:2: field 'answer' must be a non-empty string",
        ),
        ('{"problem": "x", "answer": "1"', "data.jsonl:2: not valid JSON"),
        ('["x", "1"]', "data.jsonl:2: expected a JSON object"),
        ('"x"', "data.jsonl:2: expected a JSON object"),
    ],
)
def test_load_jsonl_refuses_bad_lines_with_file_line_field(tmp_path, line, msg):
    from hara_ref.train.sft import load_jsonl

    with pytest.raises(ValueError) as e:
        load_jsonl(_data(tmp_path, '{"problem": "ok", "answer": "1"}', line))
    assert msg in str(e.value) and str(tmp_path) in str(e.value)


def test_read_jsonl_warns_on_a_torn_last_line_and_refuses_a_damaged_one(tmp_path):
    f = tmp_path / 'metrics.jsonl'
    f.write_text('{"kind": "train", "step": 1}\n{"kind": "train", "st')
    with pytest.warns(UserWarning, match=r"metrics.jsonl:2: torn last line"):
        assert [r['step'] for r in read_jsonl(f)] == [1]
    f.write_text('{"kind": "train", "step": 1}\n{"kind": "tr\n{"kind": "train", "step": 3}\n')
    with pytest.raises(ValueError, match=r"metrics.jsonl:2: not valid JSON"):
        read_jsonl(f)


# Run folders: results are never deleted; resume says what it found, refuses what it cannot do.


def _run(tmp_path, tok, name, resume=False, allow=False, **kw):
    init = tmp_path / 'init'
    if not init.exists():
        save_policy(tiny_qwen3(tok, hidden_size=32, seed=0), tok, init)
    items = builtin_items(16, 'train', max_value=9)
    kw = (
        dict(
            steps=2,
            group_size=2,
            prompts_per_step=2,
            max_new_tokens=6,
            eval_every=1,
            eval_prompts=2,
            eval_samples=2,
            lr=1e-3,
            seed=3,
        )
        | kw
    )
    extra = dict(allow_config_change=True) if allow else {}
    with warnings.catch_warnings():
        warnings.simplefilter('ignore')
        return train_run(
            TrainConfig(**kw),
            tmp_path / name,
            init,
            items,
            items[:2],
            _even_length_reward,
            resume=resume,
            progress=False,
            **extra,
        )


def _keep(d, keep):
    "Keep the rows of a run's metrics.jsonl that `keep` accepts (a kill earlier); its bytes."
    rows = [r for r in read_jsonl(d / 'metrics.jsonl') if keep(r)]
    (d / 'metrics.jsonl').write_text(''.join(json.dumps(r) + '\n' for r in rows))
    return (d / 'metrics.jsonl').read_bytes()


def test_resume_leaves_a_finished_run_without_checkpoint_alone(tok, tmp_path):
    import shutil

    _run(tmp_path, tok, 'r')
    d = tmp_path / 'r'
    shutil.rmtree(d / 'ckpt')
    before = (d / 'metrics.jsonl').read_bytes()
    rows = _run(tmp_path, tok, 'r', resume=True)
    assert (d / 'metrics.jsonl').read_bytes() == before  # nothing deleted ...
    assert not (d / 'ckpt').exists()  # ... nothing retrained
    assert [r['step'] for r in rows if r['kind'] == 'train'] == [1, 2]


def test_fresh_run_refuses_a_folder_with_results(tok, tmp_path):
    _run(tmp_path, tok, 'r')
    before = (tmp_path / 'r' / 'metrics.jsonl').read_bytes()
    with pytest.raises(ValueError, match='already holds a run'):
        _run(tmp_path, tok, 'r')
    assert (tmp_path / 'r' / 'metrics.jsonl').read_bytes() == before


def test_resume_refuses_metrics_past_a_missing_checkpoint(tok, tmp_path):
    import shutil

    _run(tmp_path, tok, 'r', steps=3)
    d = tmp_path / 'r'
    shutil.rmtree(d / 'ckpt')
    before = _keep(d, lambda r: r['step'] <= 2)  # killed before step 3: no final evaluation
    msg = r"reaches step 2, but there is no checkpoint \(the one of step 1 is missing\)"
    with pytest.raises(ValueError, match=msg):
        _run(tmp_path, tok, 'r', steps=3, resume=True)
    assert (d / 'metrics.jsonl').read_bytes() == before


def test_resume_refuses_changed_settings_unless_allowed(tok, tmp_path):
    _run(tmp_path, tok, 'r')
    saved = (tmp_path / 'r' / 'train_config.json').read_text()
    with pytest.raises(ValueError, match=r"`lr` 0.001 -> 0.002; `ppo_epochs` 2 -> 1"):
        _run(tmp_path, tok, 'r', resume=True, lr=2e-3, ppo_epochs=1)
    assert (tmp_path / 'r' / 'train_config.json').read_text() == saved
    rows = _run(tmp_path, tok, 'r', resume=True, allow=True, steps=3)  # asked for: one more step
    assert [r['step'] for r in rows if r['kind'] == 'train'] == [1, 2, 3]
    assert json.loads((tmp_path / 'r' / 'train_config.json').read_text())['steps'] == 3


@pytest.mark.parametrize(
    'name', ['trainer.pt', 'model.safetensors', 'tokenizer.json', 'config.json']
)
def test_resume_names_a_damaged_checkpoint_file(tok, tmp_path, name):
    _run(tmp_path, tok, 'r')
    d = tmp_path / 'r'
    _keep(d, lambda r: not (r['kind'] == 'eval' and r['step'] == 2))  # killed before the last eval
    f = d / 'ckpt' / name
    f.write_bytes(f.read_bytes()[: len(f.read_bytes()) // 2])  # a copy cut short
    with pytest.raises(ValueError) as e:
        _run(tmp_path, tok, 'r', resume=True)
    assert f"{f} is damaged" in str(e.value) and f"move {d} aside" in str(e.value), str(e.value)
