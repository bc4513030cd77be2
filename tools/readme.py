"""Writes README.md from nbs/index.ipynb (quarto, and so `nbdev_readme`, is not installable here).

Markdown cells are copied as they are, except that links to notebooks beside it
(`](hara_math.ipynb#...)`) are made relative to the repository root; code cells become ```python
blocks, except cells starting with `#| hide`.
"""

import json
import re
from pathlib import Path

root = Path(__file__).resolve().parent.parent
nb = json.loads((root / 'nbs' / 'index.ipynb').read_text())
parts = [
    '<!-- generated from nbs/index.ipynb by tools/readme.py: edit the notebook, not this file -->'
]
for c in nb['cells']:
    src = ''.join(c['source']).strip()
    if not src or src.startswith('#| hide'):
        continue
    if c['cell_type'] == 'markdown':
        parts.append(re.sub(r'\]\(([\w/]+\.ipynb)', r'](nbs/\1', src))
    else:
        parts.append(f'```python\n{src}\n```')
(root / 'README.md').write_text('\n\n'.join(parts) + '\n')
