"""Code reads on the rendered page: package lines of at most 100 characters (ruff checks the
chapters, tests and tools; here the exported package, apart from the lines nbdev writes itself)."""

from pathlib import Path

PKG = Path(__file__).parents[1] / 'hara_ref'


def long_lines(path: Path, limit: int = 100) -> list[int]:
    "Numbers of lines over `limit` characters, but line 1 (the docstring) and nbdev's `__all__`."
    out, in_all = [], False
    for n, line in enumerate(path.read_text().splitlines(), 1):
        in_all = line.startswith('__all__ = [') or (in_all and line.startswith(' '))
        if n > 1 and not in_all and len(line) > limit:
            out.append(n)
    return out


def test_package_lines_fit_the_page():
    bad = {str(p): long_lines(p) for p in PKG.rglob('*.py') if p.name != '_modidx.py'}
    assert not {p: n for p, n in bad.items() if n}


def test_long_lines_sees_code_but_not_nbdevs_lines(tmp_path):
    f = tmp_path / 'm.py'
    all_ = "__all__ = ['" + 'a' * 120 + "',\n" + ' ' * 11 + "'" + 'b' * 120 + "']\n"
    f.write_text('"""' + 'd' * 120 + '"""\n' + all_ + 'x = 1\n' + 'y = ' + '2' * 100 + '\n')
    assert long_lines(f) == [5]
