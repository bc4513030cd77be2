"""Property tests for hara_ref.rlvr.basics (chapter 02_rlvr), and the failure cases of its checked
twins in hara_ref.engine.verifier (chapter 43_verifier_engine)."""

import math
import os
import threading
from concurrent.futures import ThreadPoolExecutor
from fractions import Fraction
from itertools import combinations

os.environ.setdefault('HF_HUB_OFFLINE', '1')
os.environ.setdefault('TRANSFORMERS_OFFLINE', '1')
import pytest
import torch
from hypothesis import given, settings, strategies as st, HealthCheck

from hara_ref.rlvr.basics import (
    token_logprobs,
    causal_token_logprobs,
    response_mask,
    sequence_logprob,
    extract_boxed,
    exact_match_reward,
    math_reward,
    pass_at_k,
    mean_accuracy,
    mean_pass_at_k,
)
from hara_ref.engine.verifier import (
    checked_token_logprobs,
    checked_causal_token_logprobs,
    checked_response_mask,
    checked_sequence_logprob,
    checked_pass_at_k,
    checked_mean_accuracy,
    checked_mean_pass_at_k,
)

SET = settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])

# ---------------------------------------------------------------- token / sequence
# log-probabilities


@SET
@given(
    B=st.integers(1, 4),
    T=st.integers(1, 6),
    V=st.integers(2, 9),
    seed=st.integers(0, 10**6),
    dtype=st.sampled_from([torch.float32, torch.float64]),
)
def test_token_logprobs_matches_categorical(B, T, V, seed, dtype):
    g = torch.Generator().manual_seed(seed)
    logits = (torch.randn(B, T, V, generator=g) * 5).to(dtype)
    tgt = torch.randint(0, V, (B, T), generator=g)
    ref = torch.distributions.Categorical(logits=logits).log_prob(tgt)
    out = token_logprobs(logits, tgt)
    assert out.dtype == dtype and out.shape == (B, T)
    torch.testing.assert_close(out, ref)
    # shift invariance of the softmax, and all log-probs <= 0
    torch.testing.assert_close(token_logprobs(logits + 3.0, tgt), out)
    assert (out <= 0).all()


def test_token_logprobs_bf16_upcast_and_extreme_logits():
    logits = torch.tensor([[[1000.0, 0.0, -1000.0]]])
    out = token_logprobs(logits, torch.tensor([[2]]))
    assert torch.isfinite(out).all() and out.item() == pytest.approx(-2000.0)
    assert token_logprobs(logits.bfloat16(), torch.tensor([[0]])).dtype == torch.float32


@SET
@given(B=st.integers(1, 4), T=st.integers(1, 7), seed=st.integers(0, 10**6))
def test_sequence_logprob_is_masked_sum(B, T, seed):
    g = torch.Generator().manual_seed(seed)
    lp = -torch.rand(B, T, generator=g, dtype=torch.float64) * 4
    m = torch.rand(B, T, generator=g) < 0.6
    # -inf outside the mask must not matter
    lp_pad = torch.where(m, lp, torch.full_like(lp, -math.inf))
    out = sequence_logprob(lp_pad, m)
    brute = torch.tensor(
        [sum(lp[b, t].item() for t in range(T) if m[b, t]) for b in range(B)], dtype=torch.float64
    )
    torch.testing.assert_close(out, brute)
    assert torch.isfinite(out).all()
    # 0/1 int mask is accepted and gives the same
    torch.testing.assert_close(sequence_logprob(lp_pad, m.long()), out)


def test_sequence_logprob_gradient_only_on_mask():
    lp = torch.randn(2, 4, dtype=torch.float64, requires_grad=True)
    m = torch.tensor([[1, 1, 0, 0], [0, 1, 1, 1]]).bool()
    sequence_logprob(lp, m).sum().backward()
    assert torch.equal(lp.grad, m.double())


def test_response_mask_left_and_right_padding():
    # row 0: one left pad, one right pad
    am = torch.tensor([[0, 1, 1, 1, 1, 0], [1, 1, 1, 1, 1, 1]])
    out = response_mask(am, torch.tensor([3, 2]))
    assert out.tolist() == [
        [False, False, False, True, True, False],
        [False, False, True, True, True, True],
    ]


@pytest.mark.parametrize(
    'bad, msg',
    [
        (
            lambda: checked_token_logprobs(torch.zeros(2, 3), torch.zeros(2, dtype=torch.long)),
            '(B, T, V)',
        ),
        (lambda: checked_token_logprobs(torch.zeros(1, 2, 3), torch.tensor([[0, -1]])), '[0, V=3)'),
        (
            lambda: checked_token_logprobs(torch.zeros(1, 2, 3), torch.zeros(1, 2)),
            'integer token ids',
        ),
        (
            lambda: checked_token_logprobs(
                torch.tensor([[[0.0, float('nan')]]]), torch.tensor([[0]])
            ),
            'NaN',
        ),
        (
            lambda: checked_causal_token_logprobs(
                torch.zeros(1, 4, 3), torch.zeros(1, 3, dtype=torch.long)
            ),
            'input_ids (B, T)',
        ),
        (
            lambda: checked_sequence_logprob(torch.zeros(2, 3), torch.ones(3, 2).bool()),
            'differ in shape',
        ),
        (
            lambda: checked_sequence_logprob(
                torch.tensor([[float('nan')]]), torch.ones(1, 1).bool()
            ),
            'NaN',
        ),
        (lambda: checked_response_mask(torch.ones(2, 3), [1, 2, 3]), '3 entries for 2 rows'),
        (lambda: checked_response_mask(torch.ones(2, 3), [-1, 2]), 'prompt_lens must lie'),
        (lambda: checked_response_mask(torch.ones(3), [1]), '(B, T)'),
    ],
)
def test_logprob_bad_input(bad, msg):
    with pytest.raises((ValueError, TypeError), match=None) as e:
        bad()
    assert msg in str(e.value)


@pytest.fixture(scope='module')
def tiny_qwen3():
    from transformers import Qwen3Config, Qwen3ForCausalLM

    torch.manual_seed(0)
    cfg = Qwen3Config(
        vocab_size=17,
        hidden_size=16,
        intermediate_size=32,
        num_hidden_layers=2,
        num_attention_heads=2,
        num_key_value_heads=1,
        head_dim=8,
        max_position_embeddings=64,
        initializer_range=0.3,
        pad_token_id=0,
        eos_token_id=1,
        bos_token_id=None,
    )
    return Qwen3ForCausalLM(cfg).double().eval()


def test_qwen3_batched_equals_prefix_product(tiny_qwen3):
    """The batched, shifted, masked sum equals the product of next-token probabilities, prefix by
    prefix."""
    g = torch.Generator().manual_seed(1)
    rows = [
        (
            torch.randint(2, 17, (p,), generator=g).tolist(),
            torch.randint(1, 17, (o,), generator=g).tolist(),
        )
        for p, o in [(3, 5), (6, 2), (1, 7)]
    ]
    T = max(len(q) + len(o) for q, o in rows) + 2  # extra right padding
    ids = torch.zeros(len(rows), T, dtype=torch.long)
    am = torch.zeros_like(ids)
    for b, (q, o) in enumerate(rows):
        ids[b, : len(q) + len(o)] = torch.tensor(q + o)
        am[b, : len(q) + len(o)] = 1
    with torch.no_grad():
        logits = tiny_qwen3(input_ids=ids, attention_mask=am).logits
    seq = sequence_logprob(
        causal_token_logprobs(logits, ids), response_mask(am, [len(q) for q, _ in rows])[:, 1:]
    )
    for b, (q, o) in enumerate(rows):
        lp = 0.0
        with torch.no_grad():
            for t in range(len(o)):
                p = torch.softmax(tiny_qwen3(input_ids=torch.tensor([q + o[:t]])).logits[0, -1], -1)
                lp += math.log(p[o[t]].item())
        assert seq[b].item() == pytest.approx(lp, abs=1e-10)


# ---------------------------------------------------------------- boxed extraction

_plain = st.text(alphabet=st.sampled_from(list('abcxyz0123456789+-*/^=_ ,.()[]')), max_size=6)
_atom = st.one_of(_plain, st.sampled_from(['\\{', '\\}', '\\frac', '\\sqrt', '\\\\', '\\pi ']))
_balanced = st.recursive(
    st.lists(_atom, max_size=4).map(''.join),
    lambda inner: st.lists(
        st.one_of(
            _atom, inner.map(lambda s: '{' + s + '}'), inner.map(lambda s: '\\boxed{' + s + '}')
        ),
        max_size=4,
    ).map(''.join),
    max_leaves=12,
)
_no_box_text = st.text(alphabet=st.sampled_from(list('abc 123.:;=+')), max_size=10)


@SET
@given(
    s=_balanced,
    pre=_no_box_text,
    post=_no_box_text,
    cmd=st.sampled_from(['\\boxed{', '\\boxed {', '\\fbox{']),
    earlier=st.one_of(st.none(), _balanced),
)
def test_boxed_round_trip(s, pre, post, cmd, earlier):
    head = pre if earlier is None else pre + '\\boxed{' + earlier + '}' + pre
    assert extract_boxed(head + cmd + s + '}' + post) == s


@SET
@given(s=_balanced, pre=_no_box_text)
def test_unclosed_last_box_is_none(s, pre):
    assert extract_boxed(pre + '\\boxed{1} ' + '\\boxed{' + s) is None


@SET
@given(text=st.text(max_size=40))
def test_extraction_and_rewards_never_raise(text):
    out = extract_boxed(text)
    assert out is None or isinstance(out, str)
    assert exact_match_reward(text, '14') in (0.0, 1.0)


@settings(max_examples=25, deadline=None)
@given(inner=st.text(alphabet=st.sampled_from(list('{}\\^_()[]x12+-/.,a')), max_size=12))
def test_math_reward_never_raises_on_garbage(inner):
    assert math_reward('\\boxed{' + inner + '}', '\\frac{1}{2}') in (0.0, 1.0)


@pytest.mark.parametrize(
    'pred, gold, want',
    [
        ('\\boxed{0.5}', '\\frac{1}{2}', 1.0),
        ('\\boxed{\\frac{2}{4}}', '1/2', 1.0),
        ('\\boxed{2\\pi}', '\\pi\\cdot 2', 1.0),
        ('\\boxed{x^2-1}', '(x-1)(x+1)', 1.0),
        ('\\boxed{14}', '\\boxed{14}', 1.0),
        ('\\boxed{13}', '14', 0.0),
        ('14', '14', 0.0),
        ('\\boxed{14', '14', 0.0),
        (None, '14', 0.0),
        (3.5, '14', 0.0),
    ],
)
def test_math_reward_cases(pred, gold, want):
    assert math_reward(pred, gold) == want


def test_math_reward_off_main_thread():
    with ThreadPoolExecutor(3) as ex:
        out = list(
            ex.map(
                math_reward,
                ['\\boxed{0.5}', '\\boxed{0.4}', '\\boxed{\\frac{1}{2}'] * 2,
                ['1/2'] * 6,
            )
        )
    assert out == [1.0, 0.0, 0.0] * 2


def test_exact_match_reward_on_builtin_task():
    from hara_ref.rlvr.data import sum_task, sum_solution

    probs = sum_task(20, seed=3)
    assert all(exact_match_reward(sum_solution(p), p.answer) == 1.0 for p in probs)
    assert all(
        exact_match_reward(
            sum_solution(p).replace('{' + p.answer + '}', '{' + str(int(p.answer) + 1) + '}'),
            p.answer,
        )
        == 0.0
        for p in probs
    )


# ---------------------------------------------------------------- pass@k


def _pass_at_k_exact(n, c, k):
    return 1 - Fraction(math.comb(n - c, k), math.comb(n, k))


@SET
@given(n=st.integers(1, 200), data=st.data())
def test_pass_at_k_exact_and_bounds(n, data):
    c = data.draw(st.integers(0, n))
    k = data.draw(st.integers(1, n))
    v = pass_at_k(n, c, k)
    assert 0.0 <= v <= 1.0
    assert v == pytest.approx(float(_pass_at_k_exact(n, c, k)), abs=1e-12)


@SET
@given(n=st.integers(1, 80), data=st.data())
def test_pass_at_k_monotone_in_k_and_c(n, data):
    c = data.draw(st.integers(0, n))
    ks = [pass_at_k(n, c, k) for k in range(1, n + 1)]
    assert all(a <= b + 1e-15 for a, b in zip(ks, ks[1:]))
    k = data.draw(st.integers(1, n))
    cs = [pass_at_k(n, cc, k) for cc in range(n + 1)]
    assert all(a <= b + 1e-15 for a, b in zip(cs, cs[1:]))
    assert pass_at_k(n, c, 1) == pytest.approx(c / n, abs=1e-15)


def test_pass_at_k_brute_force_small():
    for n in range(1, 7):
        for c in range(n + 1):
            s = [1] * c + [0] * (n - c)
            for k in range(1, n + 1):
                bf = sum(any(s[i] for i in sub) for sub in combinations(range(n), k)) / math.comb(
                    n, k
                )
                assert pass_at_k(n, c, k) == pytest.approx(bf, abs=1e-14)


def test_pass_at_k_large_n_is_stable():
    # binomials of this size overflow float64; the product form does not
    v = pass_at_k(5000, 3, 1000)
    assert 0 < v < 1 and math.isfinite(v)
    assert v == pytest.approx(float(_pass_at_k_exact(5000, 3, 1000)), rel=1e-12)


@pytest.mark.parametrize(
    'args, exc, msg',
    [
        ((4, 5, 1), ValueError, '0 <= c <= n'),
        ((4, -1, 1), ValueError, '0 <= c <= n'),
        ((4, 2, 0), ValueError, '1 <= k <= n'),
        ((4, 2, 5), ValueError, '1 <= k <= n'),
        ((4.0, 2, 1), TypeError, 'must be ints'),
        ((4, 2, '1'), TypeError, 'must be ints'),
    ],
)
def test_pass_at_k_bad_input(args, exc, msg):
    with pytest.raises(exc) as e:
        checked_pass_at_k(*args)
    assert msg in str(e.value)


@SET
@given(P=st.integers(1, 5), n=st.integers(1, 8), seed=st.integers(0, 10**6))
def test_mean_metrics(P, n, seed):
    t = torch.rand(P, n, generator=torch.Generator().manual_seed(seed)) < 0.4
    assert mean_accuracy(t) == pytest.approx(t.double().mean().item())
    assert mean_pass_at_k(t, 1) == pytest.approx(mean_accuracy(t))
    assert mean_pass_at_k(t, n) == pytest.approx(t.any(1).double().mean().item())


def test_mean_metrics_bad_input():
    with pytest.raises(ValueError, match='only 0/1'):
        checked_mean_accuracy([[0.5, 1.0]])
    with pytest.raises(ValueError, match='NaN'):
        checked_mean_accuracy([[float('nan'), 1.0]])
    with pytest.raises(ValueError, match='non-empty'):
        checked_mean_pass_at_k(torch.zeros(0, 3), 1)
    with pytest.raises(ValueError, match=r'need 1 <= k <= n, got k=4, n=3'):
        checked_mean_pass_at_k(torch.zeros(2, 3), 4)
    with pytest.raises(TypeError, match='must be ints'):
        checked_mean_pass_at_k(torch.zeros(2, 3), 1.0)


@SET
@given(
    B=st.integers(1, 4),
    T=st.integers(2, 6),
    V=st.integers(2, 9),
    seed=st.integers(0, 10**6),
    dtype=st.sampled_from([torch.float32, torch.float64, torch.bfloat16]),
)
def test_checked_twins_equal_the_lesson_on_valid_input(B, T, V, seed, dtype):
    "Each checked twin returns exactly what its lesson function returns on valid input."
    g = torch.Generator().manual_seed(seed)
    logits = (torch.randn(B, T, V, generator=g) * 3).to(dtype)  # (B, T, V)
    ids = torch.randint(0, V, (B, T), generator=g)  # (B, T)
    assert torch.equal(checked_token_logprobs(logits, ids), token_logprobs(logits, ids))
    assert torch.equal(
        checked_causal_token_logprobs(logits, ids), causal_token_logprobs(logits, ids)
    )
    am = torch.arange(T)[None, :] < torch.randint(1, T + 1, (B, 1), generator=g)  # (B, T)
    p = torch.randint(0, T + 1, (B,), generator=g).tolist()
    assert torch.equal(checked_response_mask(am.long(), p), response_mask(am.long(), p))
    lp = token_logprobs(logits, ids)  # (B, T)
    for m in (am, am.long()):
        assert torch.equal(checked_sequence_logprob(lp, m), sequence_logprob(lp, m))
    t = torch.rand(B, T, generator=g) < 0.4  # (P, n) correctness table
    assert checked_mean_accuracy(t) == mean_accuracy(t)
    for k in range(1, T + 1):
        assert checked_mean_pass_at_k(t, k) == mean_pass_at_k(t, k)
        assert checked_pass_at_k(T, int(t[0].sum()), k) == pass_at_k(T, int(t[0].sum()), k)


def test_math_reward_timeout_in_main_thread():
    import time

    assert threading.current_thread() is threading.main_thread()
    t0 = time.time()
    assert math_reward('\\boxed{9^{9^{9^{9}}}}', '\\frac{1}{2}', timeout_s=1) == 0.0
    assert time.time() - t0 < 30
