"""`hara-ref check` gives exit code 0 only on its verdict of PASS: a function under test that ends
in any way other than returning (SystemExit, KeyboardInterrupt, ending the process) fails its case,
named, with exit code 1; the Python API fails the case too, and limits each call by default."""

import inspect
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from hara_ref.rlvr.grpo import k3_kl
from hara_ref.testing import DEFAULT_TIMEOUT, assert_conforms
from hara_ref.testing.vectors import check_cli, check_parser, check_vectors

VECTORS = Path(__file__).parent / 'vectors'
K3 = '''import os
import sys
import signal
from hara_ref.rlvr.grpo import k3_kl

calls = []


def sys_exit_0(logp, ref_logp):
    sys.exit(0)


def sys_exit_none(logp, ref_logp):
    sys.exit()


def os_exit_0(logp, ref_logp):
    os._exit(0)


def interrupt(logp, ref_logp):
    raise KeyboardInterrupt


def killed(logp, ref_logp):
    os.kill(os.getpid(), signal.SIGKILL)


def exit_on_third_call(logp, ref_logp):
    "Right on two cases, then ends the process with exit code 0."
    calls.append(1)
    if len(calls) == 3:
        print('PASS')
        os._exit(0)
    return k3_kl(logp, ref_logp)


def right(logp, ref_logp):
    return k3_kl(logp, ref_logp)
'''
# function, what the report names
ENDINGS = {
    'sys_exit_0': 'fn raised SystemExit(0) instead of returning',
    'sys_exit_none': 'fn raised SystemExit() instead of returning',
    'os_exit_0': 'fn ended the process (exit code 0) instead of returning',
    'interrupt': 'fn raised KeyboardInterrupt() instead of returning',
    'killed': 'fn ended the process (signal 9) instead of returning',
    'exit_on_third_call': 'fn ended the process (exit code 0) instead of returning',
}


@pytest.fixture
def ends(tmp_path, monkeypatch):
    "A module `ends` in the working directory, imported by the command from there."
    (tmp_path / 'ends.py').write_text(K3)
    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr(sys, 'path', list(sys.path))
    monkeypatch.delitem(sys.modules, 'ends', raising=False)
    return tmp_path


@pytest.mark.parametrize('name', list(ENDINGS))
def test_a_function_that_does_not_return_fails_its_case(name, ends, capsys):
    rc = check_cli([f'ends:{name}', '--quantity', 'k3_kl', '--examples', '5'])
    out, err = capsys.readouterr()
    assert rc == 1, out + err
    lines = out.splitlines()
    assert lines[0] == f'FAIL ends:{name} does not conform to k3_kl', out
    assert lines[1] == f'k3_kl(clamp=False) does not conform: {ENDINGS[name]}', out
    assert 'case (paste into a test):' in out and '    logp = torch.tensor(' in out


def test_the_console_script_exits_1_when_the_function_ends_the_process(tmp_path):
    "As a user runs it: `os._exit(0)` inside the function, and the command's own exit code."
    (tmp_path / 'ends.py').write_text(K3)
    exe = shutil.which('hara-ref') or str(Path(sys.executable).parent / 'hara-ref')
    env = dict(os.environ, OMP_NUM_THREADS='1', HF_HUB_OFFLINE='1', TRANSFORMERS_OFFLINE='1')
    for name in ('os_exit_0', 'right'):
        r = subprocess.run(
            [exe, 'check', f'ends:{name}', '--quantity', 'k3_kl', '--examples', '5'],
            cwd=tmp_path,
            capture_output=True,
            text=True,
            timeout=300,
            env=env,
        )
        want = (1, 'FAIL') if name == 'os_exit_0' else (0, 'PASS')
        assert (r.returncode, r.stdout[:4]) == want, r.stdout + r.stderr


def test_a_module_that_ends_the_process_on_import_cannot_run(ends, capsys):
    (ends / 'exits_on_import.py').write_text('import os\n\nos._exit(0)\n')
    assert check_cli(['exits_on_import:k3', '--quantity', 'k3_kl']) == 2
    out, err = capsys.readouterr()
    assert out == '' and err == (
        'hara-ref check: cannot import exits_on_import: the process ended (exit code 0)\n'
    )


def sys_exit(*args):
    sys.exit(0)


def interrupt(*args):
    raise KeyboardInterrupt


def generator_exit(*args):
    raise GeneratorExit


@pytest.mark.parametrize('fn', [sys_exit, interrupt, generator_exit])
def test_the_python_api_fails_the_case_of_a_function_that_does_not_return(fn):
    for check in (
        lambda: assert_conforms(fn, 'k3_kl', max_examples=5),
        lambda: check_vectors(fn, 'k3_kl', VECTORS),
    ):
        with pytest.raises(AssertionError, match='instead of returning') as e:
            check()
        assert 'logp = torch.tensor(' in str(e.value)
    # without a time limit the call runs in this thread: SystemExit is still the case's failure
    if fn is sys_exit:
        with pytest.raises(AssertionError, match=r'fn raised SystemExit\(0\) instead of returning'):
            assert_conforms(fn, 'k3_kl', max_examples=5, timeout=None)


def test_the_python_api_limits_each_call_as_the_command_does():
    "A hanging function cannot hang a test run: the API's default limit is the command's."
    cli = check_parser().parse_args(['m:f', '--quantity', 'k3_kl']).timeout
    for f in (assert_conforms, check_vectors):
        assert inspect.signature(f).parameters['timeout'].default == DEFAULT_TIMEOUT == cli == 60
    assert_conforms(k3_kl, 'k3_kl', max_examples=5)  # a function that returns passes
