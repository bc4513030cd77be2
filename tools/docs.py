"""Builds the docs: runs the notebooks of nbs/ the way `nbdev_test` does and renders each one, with
its outputs, into a static HTML page of _docs/ (index.html from nbs/index.ipynb, one page per
notebook).

    python tools/docs.py                                  # every notebook -> _docs/
    python tools/docs.py --out /tmp/site nbs/1_rlvr/01_data.ipynb nbs/hara_math.ipynb
    python tools/docs.py --no-exec                        # render without running (no outputs)

Figures are embedded in the pages as data URIs. Math is typeset in the browser by KaTeX, fetched
once from the npm registry (`npm pack`) into .cache/ and copied beside the pages: no page loads
anything from the network. A notebook that raises stops the build with its traceback, so a built
site has no error output.
"""

import argparse
import base64
import html
import multiprocessing
import os
import re
import shutil
import subprocess
import sys
import tarfile
import tempfile
import time
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
KATEX = '0.19.1'  # KaTeX version from the npm registry
# cells never run; `slow` cells (which nbdev_test skips) do run here, so the site shows their
# figures and numbers
SKIP_FLAGS = {'notest'}


def katex_bundle(cache: Path = ROOT / '.cache') -> Path:
    """Folder with katex.min.js, katex.min.css, fonts/ and LICENSE of KaTeX `KATEX`, fetched by `npm
    pack` once."""
    dest = cache / f'katex-{KATEX}'
    if (dest / 'katex.min.js').exists():
        return dest
    if not shutil.which('npm'):
        sys.exit(
            'docs: npm is needed once, to fetch KaTeX from the npm registry (apt-get install npm)'
        )
    part = dest.parent / (dest.name + '.part')
    shutil.rmtree(part, ignore_errors=True)
    with tempfile.TemporaryDirectory() as tmp:
        subprocess.run(
            ['npm', 'pack', f'katex@{KATEX}', '--pack-destination', tmp],
            check=True,
            capture_output=True,
        )
        with tarfile.open(next(Path(tmp).glob('katex-*.tgz'))) as tf:
            for m in tf.getmembers():
                name = m.name.removeprefix('package/')
                keep = name in (
                    'dist/katex.min.js',
                    'dist/katex.min.css',
                    'LICENSE',
                ) or re.fullmatch(r'dist/fonts/[\w-]+\.woff2', name)
                if m.isfile() and keep:
                    out = part / name.removeprefix('dist/')
                    out.parent.mkdir(parents=True, exist_ok=True)
                    out.write_bytes(tf.extractfile(m).read())
    part.rename(dest)
    return dest


def run_notebook(path: Path, execute: bool = True):
    """The notebook with directives parsed (and removed from the source) and, if `execute`, its
    outputs, as `nbdev_test` runs it."""
    from nbdev.process import NBProcessor

    # no FrontmatterProc: the title cell stays a markdown cell, shown as it is
    nb = NBProcessor(path).nb
    if not execute:
        return nb
    # a core chapter's committed outputs (tools/pages.py) go: execnb keeps a cell's old outputs
    # when the cell now shows nothing
    for c in nb.cells:
        if c.cell_type == 'code':
            c.outputs = []
    from execnb.shell import CaptureShell
    from fastcore.xtras import working_directory

    os.environ['IN_TEST'] = '1'

    def no_eval(cell):
        if cell.cell_type != 'code' or 'nbdev_export' + '(' in cell.source:
            return True
        d = getattr(cell, 'directives_', {}) or {}
        return d.get('eval:', [''])[0].lower() == 'false' or bool(SKIP_FLAGS & d.keys())

    shell = CaptureShell(path)
    with working_directory(path.parent):
        try:
            shell.run_all(nb, exc_stop=True, preproc=no_eval)
        except Exception:
            raise RuntimeError(
                f'docs: {path.name} raised, no page written\n{shell.prettytb(fname=path)}'
            ) from None
    return nb


def markdown():
    "CommonMark with tables, raw HTML, heading ids, and $...$ / $$...$$ kept apart for KaTeX."
    from markdown_it import MarkdownIt
    from mdit_py_plugins.dollarmath import dollarmath_plugin
    from mdit_py_plugins.anchors import anchors_plugin

    md = (
        MarkdownIt('commonmark', {'html': True})
        .enable('table')
        .use(dollarmath_plugin, double_inline=True)
        .use(anchors_plugin, max_level=3)
    )
    md.add_render_rule(
        'math_inline_double',
        lambda self, tokens, idx, options, env: (
            f'<span class="math display">{html.escape(tokens[idx].content)}</span>'
        ),
    )
    return md


def table_math(src: str) -> str:
    """In table rows, a `|` inside $...$ becomes \\vert, so the row is not split there (Jupyter
    takes the math out first)."""
    return re.sub(
        r'(?m)^\|.*$',
        lambda row: re.sub(r'\$[^$]+\$', lambda m: re.sub(r'(?<!\\)\|', r'\\vert ', m[0]), row[0]),
        src,
    )


def _text(v):
    return ''.join(v) if isinstance(v, list) else v


def _stream(text: str) -> str:
    """What a terminal would show: ANSI colours dropped, each line up to its last carriage return
    (progress bars)."""
    text = re.sub(r'\x1b\[[0-9;]*[A-Za-z]', '', text)
    return '\n'.join(l.rstrip('\r').rsplit('\r', 1)[-1] for l in text.split('\n'))


def render_output(o: dict, md) -> str:
    "One output of a code cell as HTML: images as data URIs, HTML as is, text in <pre>."
    kind = o['output_type']
    if kind == 'stream':
        return f'<pre class="output {o["name"]}">{html.escape(_stream(_text(o["text"])))}</pre>'
    if kind == 'error':
        return (
            f'<pre class="output error">{html.escape(_stream(chr(10).join(o["traceback"])))}</pre>'
        )
    data, meta = o.get('data', {}), o.get('metadata', {})
    if 'image/png' in data:
        w = meta.get('image/png', {}).get('width')
        src = 'data:image/png;base64,' + _text(data['image/png']).strip()
        return f'<img class="output" alt="figure" src="{src}"{f" width={w}" if w else ""}>'
    if 'image/svg+xml' in data:
        svg = base64.b64encode(_text(data['image/svg+xml']).encode()).decode()
        return f'<img class="output" alt="figure" src="data:image/svg+xml;base64,{svg}">'
    if 'text/html' in data:
        return f'<div class="output">{_text(data["text/html"])}</div>'
    if 'text/markdown' in data:
        return f'<div class="output">{md.render(_text(data["text/markdown"]))}</div>'
    return f'<pre class="output">{html.escape(_text(data.get("text/plain", "")))}</pre>'


def render_cells(nb, md) -> str:
    """The page body: markdown cells as HTML, code cells highlighted, followed by their outputs; `#|
    hide` cells left out."""
    from pygments import highlight
    from pygments.lexers import PythonLexer
    from pygments.formatters import HtmlFormatter

    parts = []
    for c in nb.cells:
        d = getattr(c, 'directives_', {}) or {}
        if c.cell_type == 'markdown':
            parts.append(md.render(table_math(c.source)))
        if c.cell_type != 'code' or 'hide' in d:
            continue
        # directives nbdev keeps in the source (`#| default_exp`) are for the tools, not the reader
        src = ''.join(x for x in c.source.splitlines(True) if not x.startswith('#|'))
        if src.strip() and d.get('echo:', ['true'])[0].lower() != 'false':
            parts.append(highlight(src, PythonLexer(), HtmlFormatter()))
        if d.get('output:', ['true'])[0].lower() != 'false':
            parts += [render_output(o, md) for o in c.get('outputs', [])]
    body = '\n'.join(parts)
    # links between notebooks
    return re.sub(r'href="(?:[\w.]+/)*(\w+)\.ipynb(#[^"]*)?"', r'href="\1.html\2"', body)


def build_page(path: Path, execute: bool = True) -> tuple:
    "(name, title, body HTML, seconds) of one notebook; run in a worker process."
    t0 = time.time()
    nb = run_notebook(path, execute)
    title = next(
        (
            m[1]
            for c in nb.cells
            if c.cell_type == 'markdown'
            for m in [re.match(r'#\s+(.+)', c.source)]
            if m
        ),
        path.stem,
    )
    return path.stem, title, render_cells(nb, markdown()), time.time() - t0


CSS = """body{margin:0;font:16px/1.55 system-ui,sans-serif;color:#222;display:flex}
nav{position:sticky;top:0;height:100vh;overflow-y:auto;flex:0 0 15rem;padding:1rem;
background:#f6f7f9;border-right:1px solid #ddd;font-size:14px}
nav a{display:block;padding:2px 0;color:#246;text-decoration:none}nav a.here{font-weight:bold}
nav .part{margin:.8em 0 .2em;font-weight:600;color:#555;font-size:12px;text-transform:uppercase}
main{flex:1;min-width:0;max-width:72rem;padding:1rem 2rem 4rem}
table{border-collapse:collapse;display:block;overflow-x:auto}
td,th{border:1px solid #ddd;padding:3px 8px;vertical-align:top}
blockquote{margin:1em 0;padding:.2em 1em;border-left:4px solid #9ab;background:#f5f8fa}
pre{overflow-x:auto;padding:.6em;font-size:13px;line-height:1.4}
.highlight pre{background:#f7f7f9;border:1px solid #e3e3e8}
pre.output{margin-top:-.6em;border-left:3px solid #cde}pre.stderr{background:#fff6e0}
pre.error{background:#fdd}
img.output{max-width:100%;height:auto;display:block;margin:.5em 0}
.math.display{display:block;overflow-x:auto}
.pager{display:flex;justify-content:space-between;margin-top:3em;border-top:1px solid #ddd;
padding-top:1em}"""

PARTS = {
    '1_rlvr': 'I. RLVR and GRPO',
    '2_ot': 'II. Optimal transport',
    '3_hara': 'III. HARA',
    '4_train': 'IV. Training',
    '5_practice': 'V. In practice',
    '6_engine': 'VI. The engine',
    '7_trainer': 'VII. The trainer',
    '8_methods': 'VIII. Other methods',
    '9_bench': 'IX. Measurements',
}
PART_OF = {}  # page name -> its part folder, filled by `build`


def page_order(p: Path) -> tuple:
    "Reading order: the front page, the book's map, the mathematics, then the chapters by number."
    return (p.stem != 'index', p.stem != 'book', p.stem != 'hara_math', p.stem)


def all_notebooks() -> list:
    """Every notebook of nbs/ and its part folders, in reading order (`page_order`)."""
    nbs = [
        p for p in (ROOT / 'nbs').rglob('*.ipynb') if not any(q.startswith('.') for q in p.parts)
    ]
    return sorted(nbs, key=page_order)


def page_html(name: str, title: str, body: str, pages: list) -> str:
    "A complete page: navigation to every page, the body, KaTeX (local) to typeset the math."
    from pygments.formatters import HtmlFormatter

    names = [n for n, _ in pages]
    i = names.index(name)
    nav, part = [], None
    for n, t in pages:
        if PART_OF.get(n) != part and PART_OF.get(n):
            nav.append(f'<div class="part">{PARTS[PART_OF[n]]}</div>')
        part = PART_OF.get(n)
        here = ' class=here' if n == name else ''
        nav.append(f'<a href="{n}.html"{here}>{html.escape("Overview" if n == "index" else t)}</a>')
    nav = '\n'.join(nav)
    prev = (
        f'<a href="{pages[i - 1][0]}.html">← {html.escape(pages[i - 1][1])}</a>'
        if i > 0
        else '<span></span>'
    )
    nxt = (
        f'<a href="{pages[i + 1][0]}.html">{html.escape(pages[i + 1][1])} →</a>'
        if i + 1 < len(pages)
        else ''
    )
    return f"""<!doctype html>
<html lang="en"><head><meta charset="utf-8">
<meta name="viewport" content="width=device-width, initial-scale=1">
<title>{html.escape(title)} · hara_ref</title>
<link rel="stylesheet" href="katex/katex.min.css">
<style>{CSS}
{HtmlFormatter().get_style_defs('.highlight')}</style></head>
<body><nav><strong><a href="index.html">hara_ref</a></strong>
{nav}</nav>
<main>
{body}
<div class="pager">{prev}{nxt}</div></main>
<script src="katex/katex.min.js"></script>
<script>for (const e of document.querySelectorAll('.math'))
  katex.render(e.textContent, e, {{displayMode: !e.classList.contains('inline'),
                                   throwOnError: false, strict: false}});
</script>
</body></html>
"""


def link_chapters(body: str, names: set) -> str:
    "In the book's chapter map, turn a `name` table cell into a link to that page."
    return re.sub(
        r'<td><code>(\w+)</code></td>',
        lambda m: (
            f'<td><a href="{m[1]}.html"><code>{m[1]}</code></a></td>' if m[1] in names else m[0]
        ),
        body,
    )


def build(
    nbs: list, out: Path, execute: bool = True, workers: int = 2, prune: bool = False
) -> list:
    """Run and render `nbs` into `out`; returns [(name, title, seconds)] in page order (index
    first). `prune`: also delete the pages and screenshots of notebooks not in `nbs` (renamed or
    removed ones)."""
    t0 = time.time()
    nbs = sorted(nbs, key=page_order)
    done = {}

    def keep(name, title, body, secs):
        done[name] = (title, body, secs)
        print(f'docs: {name} {secs:.1f} s', flush=True)

    if not execute:  # rendering alone is quick: no workers
        for p in nbs:
            keep(*build_page(p, False))
    # a fresh process per notebook, as if run alone (spawned: the caller may hold OpenMP threads a
    # fork would break)
    else:
        with ProcessPoolExecutor(
            workers, mp_context=multiprocessing.get_context('spawn'), max_tasks_per_child=1
        ) as ex:
            for f in [
                ex.submit(build_page, p) for p in sorted(nbs, key=lambda p: -p.stat().st_size)
            ]:
                keep(*f.result())
    pages = [(p.stem, done[p.stem][0]) for p in nbs]
    PART_OF.update({p.stem: p.parent.name for p in nbs if p.parent.name in PARTS})
    out.mkdir(parents=True, exist_ok=True)
    shutil.copytree(katex_bundle(), out / 'katex', dirs_exist_ok=True)
    for name, title in pages:
        body = done[name][1]
        if name in ('index', 'book'):
            body = link_chapters(body, {n for n, _ in pages})
        (out / f'{name}.html').write_text(page_html(name, title, body, pages))
    if prune:
        names = {n for n, _ in pages}
        for old in [*out.glob('*.html'), *(out / '_shots').glob('*.png')]:
            if old.stem not in names:
                old.unlink()
    print(f'docs: {len(pages)} pages in {out} ({time.time() - t0:.0f} s)')
    return [(n, t, done[n][2]) for n, t in pages]


if __name__ == '__main__':
    p = argparse.ArgumentParser(description=__doc__.split('\n')[0])
    p.add_argument(
        'notebooks', nargs='*', type=Path, help='notebooks to build (default: all of nbs/)'
    )
    p.add_argument('--out', type=Path, default=ROOT / '_docs')
    p.add_argument(
        '--no-exec',
        dest='execute',
        action='store_false',
        help='render without running the notebooks',
    )
    p.add_argument('--workers', type=int, default=2)
    a = p.parse_args()
    # workers unpickle `docs.build_page`, not `__main__.build_page`
    sys.path.insert(0, str(ROOT / 'tools'))
    import docs

    nbs = [n.resolve() for n in a.notebooks] or all_notebooks()
    docs.build(nbs, a.out, a.execute, a.workers, prune=not a.notebooks)
