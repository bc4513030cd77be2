"""The rhythm of the core chapters, read from the notebooks (nothing is run).

For each chapter of the core path: visible code lines (non-blank lines of code cells without
`#| hide`, directives left out), the longest visible code cell, how many visible code cells show
something, how many figures it draws and how many of them are drawn diagrams (cells that draw
patches or arrows: boxes and arrows, no data), the words of its prose (markdown cells), its
exercises (numbered items of its `## Exercises` section) and its hidden exported lines (code lines
of cells both exported and hidden). A cell *shows something* when it prints, displays or
plots, or ends with an expression (which the notebook displays); a check (`test_*`) counts as
silent. Figures are the cells that call `plt.show()` or create a figure.

    python tools/lesson_stats.py [NB_DIR]      # default nbs; the chapters of NB_DIR/core_path.txt
"""

import ast
import json
import re
import sys
from pathlib import Path

from core_path import route

SHOWS = re.compile(r'\b(print|display|show_results|Markdown)\(|\bplt\.|\bax\w*\.|\.plot\(')
FIGURE = re.compile(r'plt\.show\(|plt\.subplots\(|plt\.figure\(')
DIAGRAM = re.compile(r'patches\.|FancyArrow|FancyBboxPatch|Rectangle\(|Circle\(|arrowprops')
WORD = re.compile(r"[A-Za-z0-9][\w'’-]*")


def code_lines(src: str) -> list:
    "The lines of a code cell a reader sees: no directives, no blank lines."
    return [x for x in src.splitlines() if x.strip() and not x.startswith('#|')]


def ends_with_expression(src: str) -> bool:
    "Does the cell end with an expression the notebook displays (not a call of a test)?"
    try:
        body = ast.parse('\n'.join(x for x in src.splitlines() if not x.startswith(('#|', '%'))))
    except SyntaxError:
        return False
    last = body.body[-1] if body.body else None
    if not isinstance(last, ast.Expr) or src.rstrip().endswith(';'):
        return False
    f = last.value.func if isinstance(last.value, ast.Call) else None
    name = getattr(f, 'id', getattr(f, 'attr', ''))
    return not name.startswith('test_')


def stats(path: Path) -> dict:
    "The rhythm of one notebook."
    cells = json.loads(path.read_text())['cells']
    code = [''.join(c['source']) for c in cells if c['cell_type'] == 'code']
    vis = [s for s in code if not re.search(r'^#\|\s*hide', s, re.M) and code_lines(s)]
    shows = [s for s in vis if SHOWS.search(s) or ends_with_expression(s)]
    prose = '\n'.join(''.join(c['source']) for c in cells if c['cell_type'] == 'markdown')
    ex = prose[prose.index('## Exercises') :] if '## Exercises' in prose else ''
    hidden_export = [
        s
        for s in code
        if re.search(r'^#\|\s*export', s, re.M) and re.search(r'^#\|\s*hide', s, re.M)
    ]
    return dict(
        words=len(WORD.findall(prose)),
        diagrams=sum(bool(FIGURE.search(s) and DIAGRAM.search(s)) for s in code),
        exercises=len(re.findall(r'^\d+\. ', ex, re.M)),
        hidden_exported=sum(len(code_lines(s)) for s in hidden_export),
        visible_lines=sum(len(code_lines(s)) for s in vis),
        longest_cell=max((len(code_lines(s)) for s in vis), default=0),
        visible_cells=len(vis),
        cells_showing=len(shows),
        figures=sum(bool(FIGURE.search(s)) for s in code),
    )


def main(root='nbs'):
    head = ('chapter', 'visible lines', 'longest cell', 'cells showing', 'figures', 'diagrams')
    head += ('words', 'exercises', 'hidden exported lines')
    print('| ' + ' | '.join(head) + ' |\n|' + '---|' * len(head))
    total = dict(words=0, diagrams=0, exercises=0, hidden_exported=0)
    for ch in route(Path(root)):
        s = stats(Path(root) / ch)
        total = {k: v + s[k] for k, v in total.items()}
        print(
            f"| {Path(ch).stem} | {s['visible_lines']} | {s['longest_cell']} | "
            f"{s['cells_showing']} of {s['visible_cells']} | {s['figures']} | {s['diagrams']} | "
            f"{s['words']:,} | {s['exercises']} | {s['hidden_exported']} |"
        )
    print(
        f"| all | | | | | {total['diagrams']} | {total['words']:,} | {total['exercises']} | "
        f"{total['hidden_exported']} |"
    )


if __name__ == '__main__':
    main(*sys.argv[1:])
