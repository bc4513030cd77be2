"""Chapters 15 (the policy) and 17 (the RL step): the sampler against decoding without a cache,
the warm start's demonstrations, the routes of a countdown prompt, and chapter 17's rare-route file
against a short rerun of the tool that wrote it."""

import importlib.util
import inspect
import json
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from hara_ref.rlvr.countdown import Countdown, countdown_strategy, solution_text, solutions
from hara_ref.rlvr.data import sum_solution, sum_task
from hara_ref.train.policy import char_tokenizer, encode_prompts, pad_id, policy_forward, sample
from hara_ref.train.policy import tiny_qwen3
from hara_ref.train.rl import route_scratchpads, scratchpad_logp, warm_start

ROOT = Path(__file__).resolve().parents[1]
TOOL = ROOT / 'tools' / 'rare_route.py'
RESULTS = ROOT / 'nbs' / 'results' / 'rare_route.json'


@pytest.fixture(scope='module')
def tok():
    return char_tokenizer()


def test_the_cache_is_the_fourth_argument_of_forward():
    # `sample` passes its DynamicCache by position: the argument after position_ids, whatever its
    # name (`cache` in transformers 5, `past_key_values` before)
    from transformers import Qwen3ForCausalLM

    names = list(inspect.signature(Qwen3ForCausalLM.forward).parameters)
    assert names[1:4] == ['input_ids', 'attention_mask', 'position_ids']
    assert names[4] in ('cache', 'past_key_values')


def test_sample_equals_greedy_decoding_without_a_cache(tok):
    model = tiny_qwen3(tok, hidden_size=32, seed=1)
    pi, pm = encode_prompts(tok, ['1,3,2:6=', '12,7,3:33=', '9,9:81='])  # (3, P)
    ri, rm = sample(model, pi, pm, 10, tok.eos_token_id, pad_id(tok), temperature=0)
    ids, am = pi, pm.long()
    with torch.no_grad():
        for t in range(ri.shape[1]):  # the whole sequence again at every step
            pos = (am.cumsum(-1) - 1).clamp(min=0)
            nxt = model(input_ids=ids, attention_mask=am, position_ids=pos).logits[:, -1].argmax(-1)
            assert torch.equal(nxt[rm[:, t]], ri[rm[:, t], t]), t
            ids, am = torch.cat([ids, ri[:, t : t + 1]], 1), torch.cat([am, rm[:, t : t + 1]], 1)


def test_warm_start_without_demo_is_chapter_01s_scratchpads(tok):
    data = sum_task(40)
    m1, m2 = tiny_qwen3(tok, hidden_size=32), tiny_qwen3(tok, hidden_size=32)
    l1 = warm_start(m1, tok, data, steps=3, batch=4)
    l2 = warm_start(m2, tok, data, steps=3, batch=4, demo=lambda q, rng: sum_solution(q))
    assert l1 == l2 and l1[-1] < l1[0]
    assert all(torch.equal(a, b) for a, b in zip(m1.parameters(), m2.parameters()))


def test_warm_start_refuses_a_missing_demonstration(tok):
    m = tiny_qwen3(tok, hidden_size=32)
    with pytest.raises(ValueError, match='demo gave no demonstration'):
        warm_start(m, tok, sum_task(8), steps=1, batch=2, demo=lambda q, rng: None)


def test_route_scratchpads_are_every_writing_of_a_strategy():
    p = Countdown((1, 3, 2), 6)
    assert route_scratchpads(p, '((1*3)*2)') == [
        '1*3=3;2*3=6;\\boxed{6}',
        '1*3=3;3*2=6;\\boxed{6}',
        '3*1=3;2*3=6;\\boxed{6}',
        '3*1=3;3*2=6;\\boxed{6}',
    ]
    for p in (Countdown((6, 2, 4), 8), Countdown((3, 3, 1), 5), Countdown((4, 1, 2), 6)):
        for strategy, steps in solutions(p).items():
            texts = route_scratchpads(p, strategy)
            assert all(countdown_strategy(t, p.answer) == strategy for t in texts)
            assert (solution_text(steps) in texts) == (len(steps) == 2), (p, strategy)
    assert route_scratchpads(p, '((9*9)*9)') == []


def test_scratchpad_logp_is_policy_forwards_on_real_tokens(tok):
    model = tiny_qwen3(tok, hidden_size=32)
    texts = ['1+3=4;4+2=6;\\boxed{6}', '2*3=6;\\boxed{6}']
    lp, ids = scratchpad_logp(model, tok, '1,3,2:6=', texts)  # (2, T)
    enc = tok([t + tok.eos_token for t in texts], add_special_tokens=False, padding=True)
    rm = torch.tensor(enc['attention_mask']).bool()
    pi, pm = encode_prompts(tok, ['1,3,2:6='] * 2)
    with torch.no_grad():
        want = policy_forward(model, pi, pm, ids, rm)[0]
    assert torch.equal(lp[rm], want[rm]) and torch.equal(lp[~rm], torch.zeros_like(lp[~rm]))
    assert bool((lp[rm] < 0).all())


def _tool():
    spec = importlib.util.spec_from_file_location('rare_route', TOOL)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


@pytest.mark.parametrize(
    'args, flag',
    [(['--seeds', '1'], '--seeds'), (['--steps', '0'], '--steps'), (['--seeds', 'x'], '--seeds')],
)
def test_rare_route_usage_errors(tmp_path, args, flag):
    out = tmp_path / 'r.json'
    p = subprocess.run(
        [sys.executable, str(TOOL), *args, '--out', str(out)], capture_output=True, text=True
    )
    assert p.returncode == 2 and flag in p.stderr and len(p.stderr.strip().splitlines()) == 1
    assert not out.exists()


@pytest.mark.slow
def test_rare_route_file_is_what_the_tool_makes():
    # the chapter's warm start, then seed 0's first two steps of each method: the file's first rows
    torch.set_num_threads(1)
    file = json.loads(RESULTS.read_text())
    got = _tool().run([0], steps=2)
    assert got['routes'] == file['routes'] and got['novel'] == file['novel']
    for credit in ('grpo', 'hara'):
        g, f = got['runs'][credit][0], file['runs'][credit][0]
        assert g['sampled_rare'] == f['sampled_rare'][:2] and g['correct'] == f['correct'][:2]
        for name in ('common', 'rare', 'novel'):
            # float32 log-probs of about 1 to 5, summed over a few dozen tokens
            assert g['log_p'][name] == pytest.approx(f['log_p'][name][:3], abs=1e-4), (credit, name)
