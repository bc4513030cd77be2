"""The whole game on one prompt: the numbers behind chapter 01's opening picture.

    python tools/whole_game.py [--out FILE]     # default nbs/results/whole_game.json

One prompt, a group of eight planted rollouts (chapter 01's `planted_stage_rollouts`) through four
stages: rollouts 0-3 correct, 4-7 wrong. Rollout 1 (correct) replaces its third stage by the novel
stage, which no other correct rollout visits; rollout 5 (wrong) does the same with its second,
among the wrong ones. The group is drawn twice with the same seed, once with each substitution, and
rollout 5's row is taken from the second draw (the same seed gives the same centres, stage lengths
and noise, so the rows differ only there). HARA compares a rollout only with its outcome group.
Then GRPO's token advantages (chapter 04's `group_advantages` and `token_advantages`) and
HARA-tok's (chapter 13's `hara_reference`, oracle settings). Chapter 01 may not call chapter 13,
so it draws from the file this writes; tests/test_whole_game.py checks that the file is what this
makes. Runs in seconds on one thread.
"""

import json
import sys
from pathlib import Path
from hara_ref.practice.cli import FlagParser  # a usage error: one line, exit code 2

ROOT = Path(__file__).resolve().parent.parent
OUT = ROOT / 'nbs' / 'results' / 'whole_game.json'
COMMAND = 'python tools/whole_game.py --out nbs/results/whole_game.json'
PLANTED = dict(K=8, n_stages=4, d=8, stage_len=[3, 5], noise=0.1, seed=0)
N_CORRECT = 4  # rollouts 0..3 are correct
NOVEL_CORRECT = [1, 2]  # (rollout, visited stage index) substituted by the novel stage
NOVEL_WRONG = [5, 1]


def whole_game() -> dict:
    "The example group, GRPO's and HARA's token advantages, and how they were made (a JSON dict)."
    import torch

    from hara_ref.hara.weights import ORACLE_DEFAULTS, hara_reference
    from hara_ref.rlvr.data import planted_stage_rollouts
    from hara_ref.rlvr.grpo import group_advantages, token_advantages

    kw = {**PLANTED, 'stage_len': tuple(PLANTED['stage_len'])}
    a = planted_stage_rollouts(**kw, substitute=tuple(NOVEL_CORRECT))
    b = planted_stage_rollouts(**kw, substitute=tuple(NOVEL_WRONG))
    if not (torch.equal(a.mask, b.mask) and torch.equal(a.centers, b.centers)):
        raise RuntimeError('the two draws differ beyond the substituted stage')
    i = NOVEL_WRONG[0]
    hidden, stages = a.hidden.clone(), a.stages.clone()  # (K, T, d), (K, T)
    hidden[i], stages[i] = b.hidden[i], b.stages[i]
    K = PLANTED['K']
    rewards = (torch.arange(K) < N_CORRECT).double()  # (K,)
    A = group_advantages(rewards, torch.zeros(K, dtype=torch.long))  # (K,) GRPO, Eq. (3) of 04
    grpo = token_advantages(A, a.mask)  # (K, T)
    hara, rec = hara_reference(hidden, a.mask, rewards)  # (K, T) and the record
    L = a.mask.sum(-1).tolist()  # tokens of each rollout

    def rows(x):
        return [x[k, : L[k]].tolist() for k in range(K)]

    return dict(
        command=COMMAND,
        made_by=[
            'hara_ref.rlvr.data.planted_stage_rollouts',
            'hara_ref.rlvr.grpo.group_advantages',
            'hara_ref.rlvr.grpo.token_advantages',
            'hara_ref.hara.weights.hara_reference',
        ],
        planted=PLANTED,
        novel_correct=NOVEL_CORRECT,
        novel_wrong=NOVEL_WRONG,
        novel_stage=PLANTED['n_stages'],
        oracle=dict(ORACLE_DEFAULTS),
        rewards=rewards.tolist(),
        lengths=L,
        stages=rows(stages),
        advantages=A.tolist(),
        grpo=rows(grpo),
        hara=rows(hara),
        weights=rows(rec['w']),
    )


def dumps(game: dict) -> str:
    "The JSON text: one key a line, a table (list of lists) one row a line."

    def value(v):
        if isinstance(v, list) and v and isinstance(v[0], list):
            return '[\n  ' + ',\n  '.join(json.dumps(r) for r in v) + '\n ]'
        return json.dumps(v)

    return '{\n' + ',\n'.join(f' {json.dumps(k)}: {value(v)}' for k, v in game.items()) + '\n}\n'


def main(argv=None) -> None:
    p = FlagParser(prog='tools/whole_game.py', description=__doc__.split('\n')[0])
    p.add_argument('--out', type=Path, default=OUT, help='the JSON file to write')
    a = p.parse_args(argv)
    if not a.out.parent.is_dir():
        p.error(f'--out: folder {a.out.parent} does not exist')
    import torch

    torch.set_num_threads(1)
    a.out.write_text(dumps(whole_game()))
    print(f'wrote {a.out}')


if __name__ == '__main__':
    sys.path.insert(0, str(ROOT))
    main()
