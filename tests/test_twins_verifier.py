"""The checked twins of chapter 02 (chapter 43_verifier_engine, `hara_ref.engine.verifier`): every
input that would give a NaN or an infinite log-probability is refused by name, every integer id
dtype is taken, and on valid input they return what the lesson returns."""

import pytest
import torch

from hara_ref.rlvr.basics import token_logprobs, causal_token_logprobs, sequence_logprob
from hara_ref.engine.verifier import (
    checked_token_logprobs,
    checked_causal_token_logprobs,
    checked_sequence_logprob,
)

INF, NAN = float('inf'), float('nan')


def logits_and_ids(B=2, T=4, V=5, seed=0, dtype=torch.float32):
    "Random logits (B, T, V) and ids (B, T)."
    g = torch.Generator().manual_seed(seed)
    return torch.randn(B, T, V, generator=g).to(dtype), torch.randint(0, V, (B, T), generator=g)


@pytest.mark.parametrize('dtype', [torch.float32, torch.float64, torch.bfloat16])
@pytest.mark.parametrize('bad', [INF, NAN])
@pytest.mark.parametrize('where', [(0, 0, 0), (1, 2, 4), (1, 3, 1)])
def test_logits_with_nan_or_plus_inf_are_refused(dtype, bad, where):
    "One NaN or +inf logit anywhere the twins read makes NaN log-probabilities: refused."
    logits, ids = logits_and_ids(dtype=dtype)
    logits[where] = bad
    assert torch.isnan(token_logprobs(logits, ids)).any()  # what the lesson would return
    with pytest.raises(ValueError, match=r'logits contain NaN or \+inf'):
        checked_token_logprobs(logits, ids)
    if where[1] < logits.shape[1] - 1:  # the causal twin reads every position but the last
        with pytest.raises(ValueError, match=r'logits contain NaN or \+inf'):
            checked_causal_token_logprobs(logits, ids)


def test_a_row_of_minus_inf_logits_is_refused_and_minus_inf_entries_are_taken():
    """-inf logits mask tokens out (probability 0); a row with every logit -inf has no distribution
    (NaN log-probabilities) and is refused. Where a row has a finite logit, the twins return the
    lesson's numbers, -inf at a target of probability 0."""
    logits, ids = logits_and_ids()
    logits[0, 1, :] = -INF  # (B, T, V) a row with no finite logit
    with pytest.raises(ValueError, match=r'every logit is -inf at \(batch, position\) \(0, 1\)'):
        checked_token_logprobs(logits, ids)
    logits[0, 1, :] = 0.0
    logits[1, 2, ids[1, 2]] = -INF  # the target of (1, 2) masked out
    logits[0, 0, (ids[0, 0] + 1) % 5] = -INF  # another token masked out
    lp = checked_token_logprobs(logits, ids)  # (B, T)
    assert torch.equal(lp, token_logprobs(logits, ids)) and lp[1, 2] == -INF
    assert torch.isfinite(lp[torch.arange(2)[:, None] * 4 + torch.arange(4) != 6]).all()


@pytest.mark.parametrize(
    'dtype', [torch.int8, torch.uint8, torch.int16, torch.int32, torch.int64, torch.uint16]
)
def test_every_integer_id_dtype_is_taken(dtype):
    logits, ids = logits_and_ids()
    ids = ids.to(dtype)
    assert torch.equal(checked_token_logprobs(logits, ids), token_logprobs(logits, ids))
    assert torch.equal(
        checked_causal_token_logprobs(logits, ids), causal_token_logprobs(logits, ids)
    )


@pytest.mark.parametrize('dtype', [torch.bool, torch.float32, torch.float64, torch.complex64])
def test_ids_that_are_not_integers_are_refused(dtype):
    logits, ids = logits_and_ids()
    with pytest.raises(TypeError, match=f'targets must be integer token ids, got {dtype}'):
        checked_token_logprobs(logits, ids.to(dtype))


@pytest.mark.parametrize('bad', [INF, NAN])
def test_sequence_logprob_refuses_nan_and_plus_inf_where_the_mask_reads(bad):
    """A token log-probability is <= 0 or -inf; NaN or +inf where the mask is True makes the
    sequence's NaN or +inf: refused. Off the mask nothing is read; -inf on it is log 0."""
    lp = -torch.rand(2, 5, generator=torch.Generator().manual_seed(0))  # (B, T)
    mask = torch.tensor([[1, 1, 1, 0, 0], [1, 1, 1, 1, 1]]).bool()  # (B, T)
    lp[0, 1] = bad
    with pytest.raises(ValueError, match=r'token_logp is \+inf or NaN at a masked-in position'):
        checked_sequence_logprob(lp, mask)
    lp[0, 1], lp[0, 4], lp[1, 0] = -1.0, bad, -INF  # off the mask, and log 0 on it
    out = checked_sequence_logprob(lp, mask)  # (B,)
    assert torch.equal(out, sequence_logprob(lp, mask)) and out[1] == -INF
    assert torch.isfinite(out[0])
