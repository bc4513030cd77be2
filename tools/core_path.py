"""Is the core path self-contained? (Nothing is run: the notebooks are read.)

The core path is the list in `nbs/core_path.txt`, one notebook per line, in reading order; the
front page's route is that list. A core chapter may use a `hara_ref` module only when the module is
exported by the chapter itself or by an earlier chapter of the path. Every import in every code
cell counts, exported or not: `import hara_ref.x`, `from hara_ref.x import y` (where `y` may be a
module), relative imports in exported cells, and module paths written in strings (a script a cell
runs in a subprocess).

    python tools/core_path.py [NB_DIR]     # default nbs; prints one line per problem, rc 1 if any
"""

import ast
import json
import re
import sys
from pathlib import Path

MAX_CHAPTERS = 13
DEFAULT_EXP = re.compile(r'^#\|\s*default_exp\s+(\S+)', re.M)
DOTTED = re.compile(r'\bhara_ref(?:\.[A-Za-z_]\w*)+')


def route(nbs: Path) -> list:
    "The core path: notebook paths relative to `nbs`, in reading order."
    lines = (nbs / 'core_path.txt').read_text().splitlines()
    return [x.strip() for x in lines if x.strip() and not x.startswith('#')]


def code_cells(path: Path) -> list:
    "The sources of a notebook's code cells."
    cells = json.loads(path.read_text())['cells']
    return [''.join(c['source']) for c in cells if c['cell_type'] == 'code']


def exporters(nbs: Path) -> dict:
    "Module name (`hara_ref.ot.fgw`) -> the notebook (relative to `nbs`) whose `default_exp` it is."
    out = {}
    for p in sorted(nbs.rglob('*.ipynb')):
        if '.ipynb_checkpoints' in p.parts:
            continue
        for src in code_cells(p):
            m = DEFAULT_EXP.search(src)
            if m:
                name = 'hara_ref.' + m.group(1).removesuffix('.__init__')
                out[name] = p.relative_to(nbs).as_posix()
    return out


def _owner(dotted: str, modules: dict):
    "The longest prefix of `dotted` that is an exported module (None for `hara_ref` itself)."
    parts = dotted.split('.')
    for k in range(len(parts), 1, -1):
        if '.'.join(parts[:k]) in modules:
            return '.'.join(parts[:k])
    return None


def python_source(src: str) -> str:
    "A code cell's source as Python: IPython magics and shell lines commented out."
    return '\n'.join('#' + l if l.lstrip().startswith(('%', '!')) else l for l in src.split('\n'))


def imported_modules(src: str, module: str = None, is_pkg: bool = False) -> set:
    """Names of the hara_ref modules `src` imports: `import hara_ref.x`, `from hara_ref.x import
    y` (y too when it is a module), and, in module `module`, relative imports `from ..x import y`.
    Every package on the way is imported as well (its __init__ runs)."""
    try:
        tree = ast.parse(python_source(src))
    except SyntaxError:
        return set()
    found = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            found |= {a.name for a in node.names}
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                if module is None:
                    continue
                parts = module.split('.') if is_pkg else module.split('.')[:-1]
                parts = parts[: len(parts) - (node.level - 1)]
                base = '.'.join(parts + ([node.module] if node.module else []))
            else:
                base = node.module or ''
            found.add(base)
            found |= {f'{base}.{a.name}' for a in node.names}
    mods = set()
    for name in found:
        if name == 'hara_ref' or name.startswith('hara_ref.'):
            parts = name.split('.')
            mods |= {'.'.join(parts[:i]) for i in range(1, len(parts) + 1)}
    return mods


def used_modules(path: Path, modules: dict) -> set:
    "The exported `hara_ref` modules a notebook's code cells use."
    own = next((m for m, nb in modules.items() if path.as_posix().endswith(nb)), 'hara_ref.x')
    used = set()
    for src in code_cells(path):
        # imports (relative ones in the chapter's own module), and module paths in strings
        names = imported_modules(src, own) | set(DOTTED.findall(python_source(src)))
        used |= {m for m in (_owner(n, modules) for n in names) if m}
    return used


def problems(nbs: Path) -> list:
    "One line per problem of the core path under `nbs`; empty when it is self-contained."
    path, modules = route(nbs), exporters(nbs)
    out = []
    if len(path) > MAX_CHAPTERS:
        out.append(f'the core path has {len(path)} chapters, more than {MAX_CHAPTERS}')
    if len(set(path)) < len(path):
        out.append('a chapter appears twice on the core path')
    for i, nb in enumerate(path):
        if not (nbs / nb).exists():
            out.append(f'{nb}: not found')
            continue
        allowed = set(path[: i + 1])
        for mod in sorted(used_modules(nbs / nb, modules)):
            if modules[mod] not in allowed:
                where = modules[mod] + (' (later on the path)' if modules[mod] in path else '')
                out.append(f'{nb} uses {mod}, exported by {where}: not defined before it')
    return out


if __name__ == '__main__':
    found = problems(Path(sys.argv[1] if len(sys.argv) > 1 else 'nbs'))
    print('\n'.join(found) or 'the core path is self-contained')
    sys.exit(1 if found else 0)
