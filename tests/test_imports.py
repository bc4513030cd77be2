"""The package's import graph: one way, no cycle (imports inside functions counted), no private name
across modules."""

import ast
from pathlib import Path

import pytest

PKG = Path(__file__).resolve().parent.parent / 'hara_ref'
# the package's parts, from the ground up: the lessons (parts I-IV of the book), the engine, the
# trainer, the other methods, the measurements, the practice part and the conformance kit
LESSONS = ('rlvr', 'ot', 'hara', 'train')
FLOORS = LESSONS + ('engine', 'trainer', 'methods', 'bench', 'practice', 'testing')
PARTS = FLOORS


def module_name(path: Path) -> str:
    parts = path.relative_to(PKG).with_suffix('').parts
    return '.'.join(('hara_ref',) + (parts[:-1] if parts[-1] == '__init__' else parts))


def imports(path: Path) -> list:
    "Every (module, names) that `path` imports from hara_ref, at any depth (inside functions too)."
    here, out = module_name(path).split('.'), []
    if path.name == '__init__.py':  # a package's relative imports start from the package itself
        here.append('__init__')
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            out += [(a.name, []) for a in node.names if a.name.startswith('hara_ref')]
        elif isinstance(node, ast.ImportFrom):
            base = here[: len(here) - node.level] if node.level else []
            mod = '.'.join(base + ([node.module] if node.module else []))
            if mod.startswith('hara_ref'):
                out.append((mod, [a.name for a in node.names]))
    return out


def graph() -> dict:
    # __init__ files count where they hold code (hara_ref.testing is its __init__)
    mods = {
        module_name(p): p
        for p in PKG.rglob('*.py')
        if p.name != '_modidx.py' and (p.name != '__init__.py' or 'import' in p.read_text())
    }
    return {m: {t for t, _ in imports(p) if t in mods} for m, p in mods.items()}


def find_cycle(g: dict) -> list:
    state, stack = {}, []

    def visit(m):
        state[m] = 1
        stack.append(m)
        for t in sorted(g[m]):
            if state.get(t) == 1:
                return stack[stack.index(t) :] + [t]
            if t not in state and (c := visit(t)):
                return c
        state[m] = 2
        stack.pop()
        return []

    for m in sorted(g):
        if m not in state and (c := visit(m)):
            return c
    return []


def test_modules_live_in_parts():
    for p in PKG.rglob('*.py'):
        if p.parent != PKG:
            assert p.parent.name in PARTS, p


def test_no_import_cycle_even_inside_functions():
    g = graph()
    assert len(g) > 20
    assert find_cycle(g) == [], ' -> '.join(find_cycle(g))


def test_the_cycle_finder_finds_cycles():
    assert find_cycle({'a': {'b'}, 'b': {'c'}, 'c': {'a'}}) == ['a', 'b', 'c', 'a']
    assert find_cycle({'a': {'b'}, 'b': set()}) == []


def test_no_private_name_crosses_modules():
    bad = [
        (module_name(p), m, n)
        for p in PKG.rglob('*.py')
        if p.name != '_modidx.py'
        for m, names in imports(p)
        for n in names
        if n.startswith('_')
    ]
    assert bad == []


def test_command_lines_live_in_the_cli():
    "Algorithm modules parse no command line: argparse only in the command-line modules."
    users = sorted(module_name(p) for p in PKG.rglob('*.py') if 'argparse' in p.read_text())
    cli = ['hara_ref.practice.cli', 'hara_ref.practice.commands', 'hara_ref.testing.vectors']
    assert users == cli


def test_nothing_imports_the_conformance_kit():
    "hara_ref.testing needs hypothesis (a testing tool): no other module imports it."
    bad = [
        (module_name(p), m)
        for p in PKG.rglob('*.py')
        if not module_name(p).startswith('hara_ref.testing')
        for m, _ in imports(p)
        if m.startswith('hara_ref.testing')
    ]
    assert bad == []


def engine_imports(path: Path) -> list:
    "The modules of the engine, the practice part or the conformance kit that `path` imports."
    above = FLOORS[len(LESSONS) :]
    targets = [
        t
        for m, names in imports(path)
        for t in ([f'{m}.{n}' for n in names] if m == 'hara_ref' else [m])
    ]
    return [t for t in targets if t.split('.')[1:2] and t.split('.')[1] in above]


def test_lessons_import_no_engine():
    """The lesson parts (rlvr, ot, hara, train) import nothing from the parts above them (engine,
    trainer, methods, bench, practice, the conformance kit), at any depth (inside functions too)."""
    lessons = [p for p in PKG.rglob('*.py') if p.parent.name in LESSONS]
    assert len(lessons) > 15
    bad = [(module_name(p), t) for p in lessons for t in engine_imports(p)]
    assert bad == [], bad


def test_the_engine_import_finder_looks_inside_functions(monkeypatch):
    probe = PKG / 'hara' / 'probe.py'  # a lesson module's path; the file is never written
    src = "def f():\n    from ..engine.checks import check_mask\nfrom hara_ref import testing\n"
    read = Path.read_text
    monkeypatch.setattr(
        Path, 'read_text', lambda p, *a, **k: src if p == probe else read(p, *a, **k)
    )
    assert sorted(engine_imports(probe)) == ['hara_ref.engine.checks', 'hara_ref.testing']


def part(module: str) -> str:
    "The part of a module: `hara_ref.engine.novelty` and `hara_ref.testing` (an __init__) alike."
    return module.split('.')[1] if module.count('.') >= 1 else ''


def test_no_part_imports_a_part_above_it():
    """Above the lessons, each part imports only the parts on floors below it (or itself): engine <
    trainer < methods < bench < practice < testing. The trainer reaches the methods only through the
    hooks it names by string (chapter 44), never by an import."""
    g = graph()
    floor = {p: i for i, p in enumerate(FLOORS)}
    up = [
        (m, t)
        for m, targets in g.items()
        for t in targets
        if part(m) in floor
        and part(t) in floor
        and floor[part(t)] > floor[part(m)]
        and floor[part(m)] >= len(LESSONS)
    ]
    assert up == [], up


def test_no_part_holds_more_than_a_third_of_the_package():
    lines = {}
    for p in PKG.rglob('*.py'):
        if p.name != '_modidx.py':
            key = p.parent.name if p.parent != PKG else ''
            lines[key] = lines.get(key, 0) + len(p.read_text().splitlines())
    total = sum(lines.values())
    assert max(lines.values()) <= total / 3, lines


def test_no_module_over_600_lines():
    "Modules of one topic: none passes 600 lines (nbdev's generated index aside)."
    long = {
        module_name(p): n
        for p in PKG.rglob('*.py')
        if p.name != '_modidx.py' and (n := len(p.read_text().splitlines())) > 600
    }
    assert long == {}


PUBLIC = {
    'hara_advantages': 'hara_ref.engine.hara_engine',
    'reweight_advantages': 'hara_ref.engine.hara_engine',
    'hara_novelty': 'hara_ref.engine.novelty',
    'assert_conforms': 'hara_ref.testing',
    'write_vectors': 'hara_ref.testing.vectors',
    'check_vectors': 'hara_ref.testing.vectors',
    'HaraConfig': 'hara_ref.practice.trl_config',
    'HaraGRPOTrainer': 'hara_ref.practice.trl',
}


def test_the_public_face_is_the_objects_the_chapters_define():
    import importlib

    import hara_ref

    assert sorted(hara_ref.__all__) == sorted(PUBLIC)
    for name, module in PUBLIC.items():
        assert getattr(hara_ref, name) is getattr(importlib.import_module(module), name)
    assert set(PUBLIC) <= set(dir(hara_ref))
    with pytest.raises(AttributeError, match="no attribute 'appendix_engine'"):
        hara_ref.appendix_engine


def loaded_after(code: str) -> list:
    "The heavy packages a fresh Python process holds after running `code`."
    import subprocess
    import sys

    heavy = ('torch', 'ot', 'hypothesis', 'transformers', 'trl', 'matplotlib')
    probe = f"import sys\n{code}\nprint([m for m in {heavy!r} if m in sys.modules])"
    out = subprocess.run([sys.executable, '-c', probe], capture_output=True, text=True, check=True)
    return ast.literal_eval(out.stdout.strip().splitlines()[-1])


def test_import_hara_ref_loads_nothing_heavy_and_the_oracle_only_torch():
    assert loaded_after('import hara_ref') == []
    assert loaded_after('import hara_ref; hara_ref.hara_advantages') == ['torch']
    assert 'trl' not in loaded_after('import hara_ref; hara_ref.HaraConfig()')
    assert 'hypothesis' in loaded_after('import hara_ref; hara_ref.assert_conforms')
