"""The seal of a vector set protects against accidents, not an adversary: an edit whose digests are
computed again passes `read_vectors`. A tolerance looser than the kit's rule is refused by
`check_vectors` and `hara-ref check --vectors` whatever the index says; a tighter one is kept."""

import json
import re
import shutil
from pathlib import Path

import pytest

from hara_ref.rlvr.grpo import k3_kl
from hara_ref.testing import QUANTITIES
from hara_ref.testing.vectors import case_digest, check_cli, check_vectors, read_vectors

VECTORS = Path(__file__).parent / 'vectors'


def resealed(d: Path, change) -> None:
    "`change(case)` on every case of the index in `d`, every case digest computed again."
    index = json.loads((d / 'index.json').read_text())
    for c in index['cases']:
        change(c)
        c['sha256'] = case_digest(c)
    (d / 'index.json').write_text(json.dumps(index))


def to_bf16(c):
    "A float64 case relabelled bfloat16: its inputs rounded to bf16, its tolerance bf16's."
    if c['dtype'] == 'float64':
        c['dtype'] = 'bfloat16'


LOOSER = {
    'every-atol': (lambda c: c.update(atol=1e9), 'allows atol=1000000000.0'),
    'every-rtol': (lambda c: c.update(rtol=0.5), 'allows rtol=0.5'),
    'one-atol-x10': (
        lambda c: c.update(atol=10 * c['atol']) if c['id'] == 'k3_kl-03' else None,
        r'case k3_kl-03 allows atol=',
    ),
    'atol-nan': (lambda c: c.update(atol=float('nan')), 'allows atol=nan'),
    'atol-text': (lambda c: c.update(atol='1e9'), "allows atol='1e9'"),
    'dtype-relabelled': (to_bf16, 'says bfloat16, but its logp holds torch.float64 values'),
}


@pytest.mark.parametrize('what', list(LOOSER))
def test_a_resealed_set_with_looser_tolerances_is_refused(what, tmp_path, capsys):
    change, reason = LOOSER[what]
    d = tmp_path / 'v'
    shutil.copytree(VECTORS, d)
    resealed(d, change)
    read_vectors(d)  # the seal holds: anyone can compute a sha256
    for fn in (k3_kl, lambda a, b: k3_kl(b, a)):
        with pytest.raises(ValueError, match=reason):
            check_vectors(fn, 'k3_kl', d)
    argv = ['hara_ref.rlvr.grpo:k3_kl', '--quantity', 'k3_kl', '--vectors', str(d)]
    assert check_cli(argv) == 2
    out, err = capsys.readouterr()
    assert out == '' and err.count('\n') == 1 and err.startswith('hara-ref check: '), err
    assert re.search(reason, err), err


def test_tighter_tolerances_are_kept(tmp_path):
    d = tmp_path / 'v'
    shutil.copytree(VECTORS, d)
    resealed(d, lambda c: c.update(atol=c['atol'] / 4, rtol=c['rtol'] / 4))
    assert check_vectors(k3_kl, 'k3_kl', d) == 6
    resealed(d, lambda c: c.update(atol=0.0, rtol=0.0))  # and used: float32 rounding fails now
    with pytest.raises(AssertionError, match=r'of 6 k3_kl vectors'):
        check_vectors(k3_kl, 'k3_kl', d)


def test_the_committed_tolerances_are_the_rule():
    "Every committed case's tolerance is the kit's rule, as check_vectors computes it."
    from hara_ref.testing.vectors import check_published, vector_inputs
    from safetensors.torch import load_file

    index = read_vectors(VECTORS)
    for c in index['cases']:
        q = QUANTITIES[c['quantity']]
        args, expected = vector_inputs(c, load_file(VECTORS / c['file']))
        check_published(q, c['options'], c, args, expected)
        looser = dict(c, atol=c['atol'] * (1 + 1e-6))
        with pytest.raises(ValueError, match='looser'):
            check_published(q, c['options'], looser, args, expected)
    assert len(index['cases']) > 100
