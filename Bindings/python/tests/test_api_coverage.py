"""Every function of sessionflow.h is either exposed to Python or on a commented exclusion
list (sessionflow._ffi.EXPOSED / NOT_EXPOSED); the error codes match the library's."""
import inspect
import subprocess

import pytest

import sessionflow as sf
from sessionflow import _ffi
from helpers import REPO


def header_functions():
    run = subprocess.run(["bash", "Bindings/header-functions.sh"], cwd=REPO, capture_output=True, text=True,
                         timeout=60)
    assert run.returncode == 0, run.stderr
    return set(run.stdout.split())


def resolve(path):
    target = sf
    for part in path.split("."):
        target = getattr(target, part)
    if isinstance(target, property):
        target = target.fget
    return inspect.unwrap(target)


def test_every_header_function_is_exposed_or_excluded_with_a_reason():
    functions = header_functions()
    assert len(functions) > 30
    exposed, excluded = set(_ffi.EXPOSED), set(_ffi.NOT_EXPOSED)
    assert not exposed & excluded, "both exposed and excluded"
    assert sorted(functions - exposed - excluded) == [], "header functions Python neither wraps nor excludes"
    assert sorted((exposed | excluded) - functions) == [], "listed but not in the header"
    for name, reason in _ffi.NOT_EXPOSED.items():
        assert len(reason) > 20, f"{name}: say why"


@pytest.mark.parametrize("function", sorted(_ffi.EXPOSED))
def test_each_exposed_function_is_called_by_its_python_api(function):
    source = inspect.getsource(resolve(_ffi.EXPOSED[function]))
    assert function in source, f"{_ffi.EXPOSED[function]} does not call {function}"
    assert function in _ffi.DECLARED  # with a prototype (restype, argtypes)
    assert getattr(_ffi.lib, function).argtypes is not None


def test_the_prototypes_are_all_header_functions():
    assert sorted(set(_ffi.DECLARED) - header_functions()) == []


def test_error_codes_match_the_librarys():
    known = {f"SF_{code.name}": int(code) for code in sf.ErrorCode if code != 0}
    assert sf.ERRORS == known  # a code appended to the header needs its ErrorCode (and class)
    for name, code in known.items():
        assert sf.error_name(code) == name
        error = sf.SessionFlowError.from_code(code)
        assert type(error) is not sf.SessionFlowError, f"{name} has no subclass"
        assert error.name == name and error.text == sf.strerror(code)
    assert len({type(sf.SessionFlowError.from_code(code)) for code in known.values()}) == len(known)
