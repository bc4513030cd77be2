"""Import time of the public face, side by side in one run: each statement in a fresh process,
rounds interleaved, the median of each printed with its difference to torch's own import.

    python tools/bench_import.py [--rounds 7] [--old DIR]   # DIR: a checkout of an older hara_ref

A checkout given with --old is measured in the same rounds (its `hara_ref` first on sys.path), with
the statement that reached the oracle there (`hara_ref.appendix.hara_engine`).
"""

import argparse
import statistics
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
NOW = {
    'torch alone': 'import torch',
    'import hara_ref': 'import hara_ref',
    'hara_ref.hara_advantages': 'import hara_ref; hara_ref.hara_advantages',
    'hara-ref check --help': None,  # the command line, below
}


# every case resolves `hara_ref` from its PYTHONPATH, not from the editable install's finder
UNPIN = (
    "import sys; sys.meta_path[:] = [f for f in sys.meta_path "
    "if '__editable__' not in getattr(f, '__module__', '') + repr(f)]; "
)


def once(code: str | None, path: Path) -> float:
    "Seconds a fresh process takes to run `code` (None: `hara-ref check --help`) with `path` first."
    cli = "from hara_ref.practice.cli import main; sys.exit(main(['check', '--help']))"
    cmd = [sys.executable, '-c', UNPIN + (code or cli)]
    env = {'PYTHONPATH': str(path), 'PATH': '/usr/bin:/bin', 'HF_HUB_OFFLINE': '1'}
    t = time.perf_counter()
    subprocess.run(cmd, env=env, cwd=path, check=True, capture_output=True)
    return time.perf_counter() - t


def main(argv=None) -> None:
    p = argparse.ArgumentParser(description=__doc__.split('\n')[0])
    p.add_argument('--rounds', type=int, default=7)
    p.add_argument('--old', type=Path, help='a checkout of an older hara_ref, measured beside')
    a = p.parse_args(argv)
    cases = {name: (code, ROOT) for name, code in NOW.items()}
    if a.old:
        cases['old: the oracle (appendix.hara_engine)'] = (
            'from hara_ref.appendix.hara_engine import hara_advantages',
            a.old,
        )
        cases['old: hara-ref check --help'] = (None, a.old)
    times = {name: [] for name in cases}
    for _ in range(a.rounds):
        for name, (code, path) in cases.items():
            times[name].append(once(code, path))
    base = statistics.median(times['torch alone'])
    print(f"{sys.executable}, {a.rounds} rounds, median of each (fresh process, one at a time)")
    for name, ts in times.items():
        m = statistics.median(ts)
        print(f"{name:45s} {m:6.2f} s   {m - base:+6.2f} s over torch alone")


if __name__ == '__main__':
    main()
