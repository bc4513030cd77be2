"""Writes README.md from nbs/index.ipynb (quarto, and so `nbdev_readme`, is not installable here).

Markdown cells are copied as they are; code cells become ```python blocks, except cells starting with `#| hide`.
"""
import json
from pathlib import Path

root = Path(__file__).resolve().parent.parent
nb = json.loads((root/'nbs'/'index.ipynb').read_text())
parts = ['<!-- generated from nbs/index.ipynb by tools/readme.py: edit the notebook, not this file -->']
for c in nb['cells']:
    src = ''.join(c['source']).strip()
    if not src or src.startswith('#| hide'): continue
    parts.append(src if c['cell_type'] == 'markdown' else f'```python\n{src}\n```')
(root/'README.md').write_text('\n\n'.join(parts) + '\n')
