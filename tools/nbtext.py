"""Round-trip an nbdev notebook through plain 'percent' text, for editing notebooks in a text
editor.

    python tools/nbtext.py to-py nbs/1_rlvr/04_grpo.ipynb  > /tmp/04_grpo.py   # notebook -> text
    python tools/nbtext.py to-nb /tmp/04_grpo.py nbs/1_rlvr/04_grpo.ipynb      # text -> notebook

Cells start with `# %%` (code) or `# %% [markdown]` (markdown; each line starts with `# `), followed
by ` id=CELLID` when the cell has one: ids are kept, so a round trip leaves unchanged cells
unchanged. The notebook in `nbs/` stays the source of truth; the text is a scratch copy.
"""

import json
import re
import secrets
import sys
from pathlib import Path


def to_nb(src: str) -> dict:
    cells, kind, buf, cid = [], None, [], None

    def flush():
        if kind is None:
            return
        lines = list(buf)
        while lines and not lines[-1].strip():
            lines.pop()
        while lines and not lines[0].strip():
            lines.pop(0)
        if kind == 'markdown':
            lines = [l[2:] if l.startswith('# ') else l.lstrip('#') for l in lines]
        text = '\n'.join(lines)
        cell = {
            'cell_type': kind,
            'id': cid or secrets.token_hex(4),
            'metadata': {},
            'source': text.splitlines(True),
        }
        if kind == 'code':
            cell.update(execution_count=None, outputs=[])
        cells.append(cell)

    for line in src.splitlines():
        if line.startswith('# %%'):
            flush()
            buf = []
            kind = 'markdown' if '[markdown]' in line else 'code'
            m = re.search(r' id=(\S+)', line)
            cid = m.group(1) if m else None
        else:
            buf.append(line)
    flush()
    return {
        'cells': cells,
        'metadata': {
            'kernelspec': {'display_name': 'python3', 'language': 'python', 'name': 'python3'}
        },
        'nbformat': 4,
        'nbformat_minor': 5,
    }


def to_py(nb: dict) -> str:
    out = []
    for c in nb['cells']:
        src, tag = ''.join(c['source']), f" id={c['id']}" if c.get('id') else ''
        if c['cell_type'] == 'markdown':
            out.append(
                f'# %% [markdown]{tag}\n'
                + '\n'.join(('# ' + l) if l else '#' for l in src.split('\n'))
            )
        else:
            out.append(f'# %%{tag}\n' + src)
    return '\n\n'.join(out) + '\n'


if __name__ == '__main__':
    cmd, *args = sys.argv[1:]
    if cmd == 'to-nb':
        Path(args[1]).write_text(
            json.dumps(to_nb(Path(args[0]).read_text()), indent=1, ensure_ascii=False) + '\n'
        )
    elif cmd == 'to-py':
        sys.stdout.write(to_py(json.loads(Path(args[0]).read_text())))
    else:
        sys.exit(__doc__)
