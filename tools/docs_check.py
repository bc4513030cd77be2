"""Opens every page of a built site (`make docs`) in headless Chromium, takes a screenshot of each,
and fails if a page has a JavaScript error, a resource that did not load, a missing or broken image,
math that KaTeX could not typeset or left untypeset (a `$`, `\\(`, `\\[` or `\\begin{` in the text),
or error output.

    python tools/docs_check.py                       # _docs/, screenshots in _docs/_shots/
    python tools/docs_check.py SITE --shots DIR

Needs Chromium (Debian: apt-get install chromium). Each page is opened as a probe copy with a small
script added that records errors from the start and reports what it found into the DOM, which
Chromium dumps.
"""

import argparse
import html
import json
import re
import shutil
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
RECORD = """<script>window.__errs = []; addEventListener('error', e => __errs.push(e.message ||
  'failed to load ' + (e.target.src || e.target.href)), true);</script>"""
REPORT = r"""<script>addEventListener('load', () => {
  const main = document.querySelector('main') || document.body, r = {errors: __errs};
  r.images = document.images.length; r.height = document.documentElement.scrollHeight;
  r.figure_top = [...document.images].map(
    i => Math.round(i.getBoundingClientRect().top + scrollY));
  r.broken = [...document.images].filter(i => !i.complete || i.naturalWidth === 0)
    .map(i => i.src.slice(0, 80));
  r.math = document.querySelectorAll('.katex').length;
  r.katex_errors = [...document.querySelectorAll('.katex-error')]
    .map(e => e.textContent.slice(0, 100));
  r.untypeset = [];
  const skip = {
    acceptNode: n => n.parentElement.closest('pre, code, .katex, script, style') ? 2 : 1};
  for (const w = document.createTreeWalker(main, NodeFilter.SHOW_TEXT, skip); w.nextNode();)
    if (/\$|\\\(|\\\[|\\begin\{/.test(w.currentNode.textContent))
      r.untypeset.push(w.currentNode.textContent.trim().slice(0, 100));
  r.error_outputs = document.querySelectorAll('pre.error').length +
    (main.textContent.match(/Traceback \(most recent call last\)/g) || []).length;
  r.stderr_outputs = document.querySelectorAll('pre.stderr').length;
  const out = document.createElement('pre');
  out.id = 'docs-check';
  out.textContent = JSON.stringify(r);
  document.body.appendChild(out);
});</script>"""


def chromium() -> str:
    exe = next(
        (
            shutil.which(n)
            for n in ('chromium', 'chromium-browser', 'google-chrome')
            if shutil.which(n)
        ),
        None,
    )
    if not exe:
        sys.exit('docs-check: Chromium not found (Debian: apt-get install chromium)')
    return exe


def headless(exe: str, *args) -> subprocess.CompletedProcess:
    return subprocess.run(
        [
            exe,
            '--headless',
            '--no-sandbox',
            '--disable-gpu',
            '--hide-scrollbars',
            '--no-first-run',
            '--virtual-time-budget=10000',
            *args,
        ],
        capture_output=True,
        text=True,
        timeout=120,
    )


def check_page(exe: str, page: Path, shots: Path) -> dict:
    """What the probe found on `page` (see REPORT); then a screenshot of the whole page (up to
    30,000 px tall)."""
    probe = page.with_name(f'.{page.stem}.probe.html')
    probe.write_text(
        page.read_text()
        .replace('<head>', '<head>' + RECORD, 1)
        .replace('</body>', REPORT + '</body>', 1)
    )
    try:
        dom = headless(exe, '--window-size=1280,1000', '--dump-dom', probe.as_uri()).stdout
    finally:
        probe.unlink()
    m = re.search(r'<pre id="docs-check">(.*?)</pre>', dom, re.S)
    r = json.loads(html.unescape(m[1])) if m else {'errors': ['no report: the page did not load']}
    headless(
        exe,
        f'--window-size=1280,{min(r.get("height", 2000), 30000)}',
        f'--screenshot={shots / (page.stem + ".png")}',
        page.as_uri(),
    )
    return r


def problems(r: dict) -> list:
    "The checks a page fails, from its report."
    return [
        f'{k}: {r[k]}' for k in ('errors', 'broken', 'katex_errors', 'untypeset') if r.get(k)
    ] + ([f'error outputs: {r["error_outputs"]}'] if r.get('error_outputs') else [])


def missing_fonts(site: Path) -> list:
    "KaTeX font files the stylesheet asks for first (woff2) that are not in the site."
    css = (site / 'katex' / 'katex.min.css').read_text()
    return [
        f
        for f in sorted(set(re.findall(r'url\((fonts/[\w-]+\.woff2)\)', css)))
        if not (site / 'katex' / f).exists()
    ]


if __name__ == '__main__':
    p = argparse.ArgumentParser(description=__doc__.split('\n')[0])
    p.add_argument('site', nargs='?', type=Path, default=ROOT / '_docs')
    p.add_argument('--shots', type=Path, help='screenshot folder (default SITE/_shots)')
    a = p.parse_args()
    pages = sorted(a.site.glob('*.html'))
    if not pages:
        sys.exit(f'docs-check: no pages in {a.site} (run make docs first)')
    shots = a.shots or a.site / '_shots'
    shots.mkdir(parents=True, exist_ok=True)
    exe, t0, bad, figs = chromium(), time.time(), 0, 0
    if missing_fonts(a.site):
        print(f'FAIL katex fonts missing: {missing_fonts(a.site)}')
        bad += 1
    for page in pages:
        r = check_page(exe, page, shots)
        figs += r.get('images', 0)
        fails = problems(r)
        print(
            f'{"FAIL" if fails else "ok  "} {page.name}: {r.get("images", 0)} figures, '
            f'{r.get("math", 0)} formulas, '
            f'{r.get("stderr_outputs", 0)} stderr outputs' + ''.join(f'\n     {f}' for f in fails),
            flush=True,
        )
        bad += bool(fails)
    print(
        f'docs-check: {len(pages)} pages, {figs} figures, {bad} failing; screenshots in {shots} '
        f'({time.time() - t0:.0f} s)'
    )
    sys.exit(1 if bad else 0)
