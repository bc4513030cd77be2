"""Writes README.md from nbs/index.ipynb, and BOOK.md (the chapters and every measurement, which the
README links) from nbs/book.ipynb (quarto, and so `nbdev_readme`, is not installable here).

Markdown cells are copied as they are, except that links to notebooks beside it
(`](hara_math.ipynb#...)`) are made relative to the repository root; code cells become ```python
blocks, except cells starting with `#| hide`, and cells with `#| echo: false`, which are run (in
nbs/, as the notebook runs) and give the markdown their last expression displays, such as a table
read from a committed results file.
"""

import ast
import contextlib
import json
import re
from pathlib import Path

root = Path(__file__).resolve().parent.parent


def shown(src: str, name: str = 'index') -> str:
    "The markdown an `#| echo: false` cell displays: the value of its last expression, run in nbs/."
    tree = ast.parse(src)
    last = tree.body.pop()
    if not isinstance(last, ast.Expr):
        raise ValueError(
            f"an `#| echo: false` cell of index.ipynb must end in an expression:\n{src}"
        )
    ns = {}
    with contextlib.chdir(root / 'nbs'):
        exec(compile(tree, f'{name}.ipynb', 'exec'), ns)
        out = eval(compile(ast.Expression(last.value), f'{name}.ipynb', 'eval'), ns)
    return str(getattr(out, 'data', out)).strip()  # an IPython `Markdown` keeps its text in .data


def render(name: str, out: str) -> None:
    "nbs/NAME.ipynb as markdown in OUT at the repository's root."
    nb = json.loads((root / 'nbs' / f'{name}.ipynb').read_text())
    note = f'generated from nbs/{name}.ipynb by tools/readme.py: edit the notebook, not this file'
    parts = [f'<!-- {note} -->']
    for c in nb['cells']:
        src = ''.join(c['source']).strip()
        if not src or src.startswith('#| hide'):
            continue
        if c['cell_type'] == 'markdown':
            parts.append(re.sub(r'\]\(([\w/]+\.ipynb)', r'](nbs/\1', src))
        elif re.search(r'(?m)^#\|\s*echo:\s*false\s*$', src):
            parts.append(re.sub(r'\]\(([\w/]+\.ipynb)', r'](nbs/\1', shown(src, name)))
        else:
            parts.append(f'```python\n{src}\n```')
    text = '\n\n'.join(parts) + '\n'
    # the two pages link each other as markdown files (GitHub shows those with their tables)
    text = text.replace('](nbs/book.ipynb', '](BOOK.md').replace('](nbs/index.ipynb', '](README.md')
    (root / out).write_text(text)


render('index', 'README.md')
render('book', 'BOOK.md')
