"""Committed outputs of the core chapters: readers see their figures and numbers on GitHub or in
Jupyter without building anything.

    python tools/pages.py render [NB ...]  # run the notebooks, write their outputs into the .ipynb
    python tools/pages.py check [NB ...]   # no execution: are the committed outputs current, clean?

The core chapters are listed in nbs/core_path.txt (one notebook a line, relative to nbs/); `render`
and `check` default to them. `render` runs a notebook top to bottom as `nbdev_test` does (nbdev's
`test_nb`: the same cell processing, `eval: false`, `notest` and `nbdev_export(` cells skipped,
IN_TEST=1, in the notebook's folder) with one thread, HF_HUB_OFFLINE=1 and figures captured as PNG
at `DPI`; `slow` cells run too (`--skip-slow` leaves them without output). It writes the outputs
into the notebook in place, records a provenance hash in the notebook's metadata (`META`) and runs
`nbdev_clean` on it. The hash covers the source of every code cell and of every hara_ref module the
notebook imports, transitively within hara_ref.

`check` fails (exit code 1, one line per problem, naming the notebook and the cell id) when
- a rendered notebook's hash differs from the one recomputed from the committed code and modules;
- a rendered notebook has a visible code cell that should show something (a print, a display, a
  figure, a last bare expression) and has no outputs;
- any output is unclean: a stderr stream, an error (traceback), text that looks like a Python
  warning, a progress bar, a math-verify timeout message; a cell whose source carries the comment
  `# shows a warning on purpose` may show one (the lesson is about it and says so);
- a core notebook carries outputs but no hash, or a notebook not on the core path carries outputs
  or a hash (outputs live only where they are rendered and checked).
A core notebook with no outputs and no hash is not rendered yet: `check` names it and passes
(`--strict` fails on it).
"""

import argparse
import ast
import hashlib
import html
import json
import os
import re
import subprocess
import sys
import time
from pathlib import Path

from core_path import imported_modules, route
from core_path import python_source as _python

ROOT = Path(__file__).resolve().parent.parent
META = 'hara_ref_pages'  # notebook metadata key (in settings.ini's allowed_metadata_keys)
MARKER = '# shows a warning on purpose'
DPI = 80  # figures as PNG at this resolution: readable, small in git

UNCLEAN = [
    (re.compile(r'\b\w*Warning:|warnings\.warn'), 'a Python warning'),
    (re.compile(r'\d%\||%\|[ #█▏▎▍▌▋▊▉]|\bit/s\b|\bs/it\b'), 'a progress bar'),
    (re.compile(r'Traceback \(most recent call last\)'), 'a traceback'),
    (
        re.compile(
            r'Timeout during (?:parsing|comparison)|Timeout is disabled|timeout interuption'
        ),
        'a math-verify timeout',
    ),
]
STALE = 'outputs no longer come from the committed code: run make pages'


# ---------------------------------------------------------------- which notebooks
def core_notebooks(root: Path = ROOT) -> list:
    "The core reading path: nbs/core_path.txt, one notebook a line (relative to nbs/)."
    return [root / 'nbs' / nb for nb in route(root / 'nbs')]


def all_notebooks(root: Path = ROOT) -> list:
    return sorted(
        p
        for p in (root / 'nbs').rglob('*.ipynb')
        if not any(q.startswith(('.', '_')) for q in p.relative_to(root).parts)
    )


# ---------------------------------------------------------------- provenance hash
def _text(v) -> str:
    return ''.join(v) if isinstance(v, list) else (v or '')


def module_file(name: str, root: Path = ROOT):
    "The file of module `name` (`hara_ref.a.b`) under `root`, or None."
    base = root.joinpath(*name.split('.'))
    for f in (base.with_suffix('.py'), base / '__init__.py'):
        if f.is_file():
            return f
    return None


def module_closure(sources, root: Path = ROOT) -> list:
    "Files of the hara_ref modules the code `sources` import, transitively, sorted."
    todo = set().union(*(imported_modules(s) for s in sources)) if sources else set()
    files = {}
    while todo:
        name = todo.pop()
        if name in files:
            continue
        f = module_file(name, root)
        files[name] = f
        if f is not None:
            todo |= imported_modules(f.read_text(), name, f.name == '__init__.py') - files.keys()
    return sorted(f for f in files.values() if f is not None)


def code_sources(nb: dict) -> list:
    return [_text(c['source']) for c in nb['cells'] if c['cell_type'] == 'code']


def nb_hash(nb: dict, root: Path = ROOT) -> str:
    """sha256 over the notebook's code-cell sources and the text of every hara_ref module they
    import (transitively), each module with its path."""
    h, sources = hashlib.sha256(), code_sources(nb)
    for s in sources:
        h.update(b'cell\0' + s.encode() + b'\0')
    for f in module_closure(sources, root):
        h.update(b'module\0' + f.relative_to(root).as_posix().encode() + b'\0')
        h.update(f.read_bytes() + b'\0')
    return h.hexdigest()


# ---------------------------------------------------------------- what a cell should show
def directives(src: str) -> dict:
    "nbdev's `#| name args` lines at the top of a cell."
    d = {}
    for l in src.split('\n'):
        m = re.match(r'\s*#\s*\|\s*([\w-]+:?)\s*(.*)', l)
        if m:
            d[m[1]] = m[2].split()
        elif l.strip():
            break
    return d


def runs(src: str, flags=('notest',)) -> bool:
    "Does `render` run this code cell (as nbdev_test would, `slow` included)?"
    d = directives(src)
    if 'nbdev_export' + '(' in src or d.get('eval:', [''])[0].lower() == 'false':
        return False
    return not (set(flags) & d.keys())


def shows_something(src: str) -> bool:
    """A visible cell that prints, displays or draws at top level, or ends in a bare expression
    that is not a call (a call may return None)."""
    d = directives(src)
    if 'hide' in d or d.get('output:', ['true'])[0].lower() == 'false':
        return False
    if src.rstrip().endswith(';'):
        return False
    try:
        tree = ast.parse(_python(src))
    except SyntaxError:
        return False

    def calls(node):  # calls run at top level (not inside a def, class or lambda)
        for child in ast.iter_child_nodes(node):
            if isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef, ast.Lambda)):
                continue
            if isinstance(child, ast.Call):
                yield child
            yield from calls(child)

    for node in calls(tree):
        f = node.func
        name = f.id if isinstance(f, ast.Name) else getattr(f, 'attr', '')
        if name in ('print', 'display', 'show', 'subplots', 'figure', 'imshow'):
            return True
    last = tree.body[-1] if tree.body else None
    return isinstance(last, ast.Expr) and not isinstance(last.value, (ast.Call, ast.Constant))


# ---------------------------------------------------------------- check
def output_text(o: dict) -> str:
    if o.get('output_type') == 'stream':
        return _text(o.get('text'))
    if o.get('output_type') == 'error':
        return '\n'.join(o.get('traceback', []))
    data = o.get('data', {})
    return '\n'.join(_text(v) for k, v in data.items() if k.startswith('text/'))


def unclean(o: dict) -> list:
    "What is wrong with one output: [] when it is clean."
    bad = []
    if o.get('output_type') == 'stream' and o.get('name') == 'stderr':
        bad.append('a stderr stream')
    if o.get('output_type') == 'error':
        bad.append(f'an error ({o.get("ename", "")})')
    return bad + check_text(output_text(o))


def check_text(text: str) -> list:
    "The unclean patterns found in a text (a rendered page, say)."
    return [what for pat, what in UNCLEAN if pat.search(text)]


def check_notebook(path: Path, core: bool, root: Path = ROOT) -> tuple:
    "(problems, rendered) of one notebook; each problem one line naming the notebook and cell."
    nb = json.loads(path.read_text())
    name = path.relative_to(root / 'nbs').as_posix() if path.is_relative_to(root / 'nbs') else path
    meta = nb.get('metadata', {}).get(META)
    cells = [c for c in nb['cells'] if c['cell_type'] == 'code']
    with_out = [c for c in cells if c.get('outputs')]
    probs = []
    if not core:
        probs += [
            f'{name}: cell {c.get("id")}: outputs in a notebook off the core path '
            f'(only nbs/core_path.txt notebooks carry them): nbdev_clean --clear_all --fname {path}'
            for c in with_out
        ]
        if meta:
            probs.append(f'{name}: a {META} hash in a notebook off the core path')
        return probs, False
    if not meta:
        probs += [
            f'{name}: cell {c.get("id")}: outputs with no {META} hash (run make pages)'
            for c in with_out
        ]
        return probs, False
    if meta.get('sha256') != nb_hash(nb, root):
        probs.append(f'{name}: {STALE}')
    skipped = set(meta.get('not_run', []))
    for c in cells:
        src, cid = _text(c['source']), c.get('id')
        if not c.get('outputs') and cid not in skipped and runs(src) and shows_something(src):
            probs.append(f'{name}: cell {cid}: shows nothing though it should (run make pages)')
        if MARKER in src:
            continue
        for o in c.get('outputs', []):
            probs += [f'{name}: cell {cid}: {what} in the output' for what in unclean(o)]
    return probs, True


BLOCK = re.compile(
    r'<div class="highlight">(?P<code>.*?)</div>'
    r'|<pre class="output(?P<cls>[^"]*)">(?P<pre>.*?)</pre>'
    r'|<div class="output">(?P<div>.*?)</div>',
    re.S,
)


def check_page(page: Path) -> list:
    """A built page (tools/docs.py): the outputs on it scanned for the same unclean patterns; the
    outputs of a code block with the marker comment are let be."""
    probs, marked = [], False
    for m in BLOCK.finditer(page.read_text()):
        if m['code'] is not None:
            marked = MARKER in html.unescape(re.sub(r'<[^>]+>', '', m['code']))
            continue
        if marked:
            continue
        text = html.unescape(re.sub(r'<[^>]+>', '', m['pre'] or m['div'] or ''))
        bad = check_text(text) + [
            f'{c} output' for c in ('stderr', 'error') if c in (m['cls'] or '')
        ]
        probs += [f'{page.name}: {what} on the page' for what in bad]
    return probs


def check_site(site: Path, root: Path = ROOT) -> list:
    """The pages of the core chapters in a site built by `make docs` (its HTML, no browser),
    scanned as `check_page` does; [] when there is no such site."""
    pages = [site / f'{p.stem}.html' for p in core_notebooks(root)]
    return [line for page in pages if page.exists() for line in check_page(page)]


def check(nbs=None, root: Path = ROOT, strict: bool = False, site: Path = None) -> int:
    core = {p.resolve() for p in core_notebooks(root)}
    targets = [Path(n).resolve() for n in nbs] if nbs else all_notebooks(root)
    probs, unrendered = [], []
    for p in targets:
        ps, rendered = check_notebook(p, p in core, root)
        probs += ps
        if p in core and not rendered and not ps:
            unrendered.append(
                p.relative_to(root / 'nbs').as_posix() if p.is_relative_to(root / 'nbs') else str(p)
            )
    if site is not None:
        probs += check_site(site, root)
    if strict:
        probs += [f'{n}: not rendered (run make pages)' for n in unrendered]
    for line in probs:
        print(line)
    n_core = sum(p in core for p in targets)
    note = f'; not rendered yet: {", ".join(unrendered)}' if unrendered and not strict else ''
    print(
        f'pages: {"FAIL, " + str(len(probs)) + " problems" if probs else "ok"} '
        f'({n_core - len(unrendered)}/{n_core} core notebooks rendered{note})'
    )
    return 1 if probs else 0


# ---------------------------------------------------------------- render
def env_for_render() -> dict:
    env = dict(os.environ)
    env.update(
        HF_HUB_OFFLINE='1',
        TRANSFORMERS_OFFLINE='1',
        OMP_NUM_THREADS='1',
        MKL_NUM_THREADS='1',
        OPENBLAS_NUM_THREADS='1',
        TOKENIZERS_PARALLELISM='false',
        MPLBACKEND='module://matplotlib_inline.backend_inline',
        PYTHONPATH=os.pathsep.join([str(ROOT), *filter(None, [env.get('PYTHONPATH')])]),
    )
    return env


def run_notebook(path: Path, skip_slow: bool = False) -> tuple:
    """({cell id: outputs}, [ids of cells not run]) of the notebook run as nbdev_test runs it;
    raises with the traceback if a cell raises."""
    sys.path.insert(0, str(ROOT))
    os.environ['IN_TEST'] = '1'
    from execnb.nbio import nb2dict
    from execnb.shell import CaptureShell
    from fastcore.xtras import working_directory
    from nbdev.frontmatter import FrontmatterProc
    from nbdev.process import NBProcessor

    flags = {'notest', *(['slow'] if skip_slow else [])}
    nb = NBProcessor(path, procs=FrontmatterProc, process=True).nb
    for c in nb.cells:  # execnb keeps a cell's old outputs when it now shows nothing
        if c.cell_type == 'code':
            c.outputs = []
    if str(getattr(nb, 'frontmatter_', {}).get('skip_exec', '')).lower() in ('true', '1'):
        return {}, [c.id for c in nb.cells if c.cell_type == 'code']

    not_run = []

    def no_eval(cell):  # nbdev's test_nb._no_eval, with our flags
        if cell.cell_type != 'code':
            return True
        if 'nbdev_export' + '(' in cell.source:
            return True
        d = getattr(cell, 'directives_', {}) or {}
        skip = d.get('eval:', [''])[0].lower() == 'false' or bool(flags & d.keys())
        if skip:
            not_run.append(cell.get('id'))
        return skip

    shell = CaptureShell(path, mpl_format='png')
    shell.run_cell(f"import matplotlib; matplotlib.rcParams['figure.dpi'] = {DPI}")
    with working_directory(path.parent):
        try:
            shell.run_all(nb, exc_stop=True, preproc=no_eval)
        except Exception:
            raise RuntimeError(f'pages: {path.name} raised\n{shell.prettytb(fname=path)}') from None
    outs = {
        c.id: nb2dict(c).get('outputs', []) for c in nb.cells if c.cell_type == 'code' and 'id' in c
    }
    return outs, [i for i in not_run if i]


def render_one(path: Path, skip_slow: bool = False) -> None:
    "Run one notebook, write its outputs and hash into it, nbdev_clean it (in this process)."
    t0 = time.time()
    outs, not_run = run_notebook(path, skip_slow)
    nb = json.loads(path.read_text())
    for c in nb['cells']:
        if c['cell_type'] == 'code':
            c['outputs'] = outs.get(c.get('id'), [])
            c['execution_count'] = None
    nb['metadata'][META] = {'sha256': nb_hash(nb)} | ({'not_run': not_run} if not_run else {})
    path.write_text(json.dumps(nb, sort_keys=True, indent=1, ensure_ascii=False) + '\n')
    nbdev_clean = Path(sys.executable).parent / 'nbdev_clean'
    subprocess.run([str(nbdev_clean), '--fname', str(path)], check=True, cwd=ROOT)
    print(f'pages: rendered {path.relative_to(ROOT)} in {time.time() - t0:.0f} s', flush=True)
    if not_run:
        print(f'pages: {path.name}: cells left without output (not run): {", ".join(not_run)}')


def render(nbs=None, skip_slow: bool = False) -> int:
    """Each notebook in a fresh process, one after the other (as if run alone); then `check` on
    them."""
    targets = [Path(n).resolve() for n in nbs] if nbs else core_notebooks()
    for p in targets:
        cmd = [sys.executable, __file__, 'render-one', str(p)] + (['--skip-slow'] * skip_slow)
        if subprocess.run(cmd, env=env_for_render(), cwd=ROOT).returncode:
            return 1
    return check(targets)


if __name__ == '__main__':
    ap = argparse.ArgumentParser(description=__doc__.split('\n')[0])
    ap.add_argument('command', choices=['render', 'check', 'render-one'])
    ap.add_argument('notebooks', nargs='*', type=Path, help='default: nbs/core_path.txt')
    ap.add_argument('--skip-slow', action='store_true', help='render: leave `slow` cells unrun')
    ap.add_argument('--strict', action='store_true', help='check: every core notebook rendered')
    ap.add_argument(
        '--site', type=Path, help='check: also scan the core pages of this built site (_docs)'
    )
    a = ap.parse_args()
    if a.command == 'render-one':
        render_one(a.notebooks[0].resolve(), a.skip_slow)
        sys.exit(0)
    if a.command == 'render':
        sys.exit(render(a.notebooks, a.skip_slow))
    sys.exit(check(a.notebooks, strict=a.strict, site=a.site))
