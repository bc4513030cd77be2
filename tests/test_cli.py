"The `hara-ref` console command, as a user runs it."

import os
import subprocess
import sys
import shutil


def _run(*args):
    exe = shutil.which('hara-ref') or os.path.join(os.path.dirname(sys.executable), 'hara-ref')
    return subprocess.run([exe, *args], capture_output=True, text=True, timeout=120)


def test_help_lists_commands():
    r = _run('--help')
    assert r.returncode == 0, r.stderr
    for cmd in ('train', 'bench ot', 'bench hara'):
        assert cmd in r.stdout


def test_help_imports_neither_torch_nor_pot():
    "The entry point only dispatches: its help loads no subcommand's heavy dependencies."
    code = (
        'import sys; from hara_ref.practice.cli import main; main(["--help"]); '
        "print(sorted(m for m in ('torch', 'ot', 'transformers') if m in sys.modules))"
    )
    r = subprocess.run([sys.executable, '-c', code], capture_output=True, text=True)
    assert r.returncode == 0, r.stderr
    assert r.stdout.strip().splitlines()[-1] == '[]'


def test_no_args_prints_usage():
    r = _run()
    assert r.returncode == 0 and r.stdout.startswith('usage: hara-ref')


def test_unknown_command_fails_with_message():
    r = _run('fly')
    assert r.returncode == 2
    assert "unknown command 'fly'" in r.stderr


def test_check_help_through_the_console_script_and_a_usage_error(capsys):
    """`check --help` as a user runs it; the usage error through `main` in this process (the
    console script's exit codes: `test_unknown_command_fails_with_message` here, rc 1 in
    test_testing), not a second new process that spends ~3 s importing torch and POT."""
    from hara_ref.practice.cli import main

    r = _run('check', '--help')
    assert r.returncode == 0, r.stderr
    for name in ('grpo_advantages', 'ppo_clip_loss', 'k3_kl', 'barycenter', 'hara_advantages'):
        assert f"  {name}: fn(" in r.stdout
    assert "'trl': method='grpo', eps=0.0001 (δ, added to the std)" in r.stdout
    rc = main(['check', 'hara_ref.rlvr.grpo:k3_kl', '--quantity', 'k3_kl', '--examples', '0'])
    out, err = capsys.readouterr()
    assert (rc, out) == (2, '')
    assert err == 'hara-ref check: --examples must be an integer >= 1, got 0\n'
