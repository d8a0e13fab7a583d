"""Where the library comes from: SESSIONFLOW_LIB (explicit wins), the bundled copy, the
system's; else an ImportError that says what was tried and how to fix it."""
import ctypes.util
import os
import subprocess
import sys

import pytest

import sessionflow as sf
from sessionflow import _loader
from helpers import PYTHON_DIR

LIBRARY = sf.library_path  # the library under test (SESSIONFLOW_LIB in the usual run)


def never(name):
    return None


@pytest.fixture
def bundled(tmp_path):
    """A bundle directory holding the library under test (a link: the same file, so the
    dynamic loader hands back the library already loaded, never a second copy)."""
    if not os.path.isfile(LIBRARY):
        pytest.skip("the library under test came from the system's loader, not a file path")
    directory = tmp_path / "_lib"
    directory.mkdir()
    os.symlink(os.path.realpath(LIBRARY), directory / "libsessionflow.so")
    return directory


def test_sessionflow_lib_comes_first():
    loaded = _loader.load({"SESSIONFLOW_LIB": LIBRARY}, None, never)
    assert (loaded.path, loaded.source) == (LIBRARY, "SESSIONFLOW_LIB")


def test_an_explicit_sessionflow_lib_that_fails_is_never_replaced(bundled, tmp_path):
    missing = str(tmp_path / "nowhere" / "libsessionflow.so")
    with pytest.raises(ImportError) as error:
        _loader.load({"SESSIONFLOW_LIB": missing}, bundled, lambda name: LIBRARY)
    assert isinstance(error.value, sf.LibraryNotFoundError)
    assert "SESSIONFLOW_LIB" in str(error.value) and missing in str(error.value)


def test_the_bundled_copy_comes_before_the_system(bundled):
    asked = []
    loaded = _loader.load({}, bundled, lambda name: asked.append(name) or LIBRARY)
    assert loaded.source == "bundled" and loaded.path == str(bundled / "libsessionflow.so")
    assert asked == []  # the system was not even asked


def test_the_system_library_is_the_last_resort(tmp_path):
    asked = []
    loaded = _loader.load({}, tmp_path, lambda name: asked.append(name) or LIBRARY)
    assert (loaded.source, loaded.path, asked) == ("system", LIBRARY, ["sessionflow"])


def test_none_found_says_what_was_tried_and_how_to_fix_it(tmp_path):
    with pytest.raises(ImportError) as error:
        _loader.load({}, tmp_path, never)
    message = str(error.value)
    assert "SESSIONFLOW_LIB: not set" in message
    assert str(tmp_path / "libsessionflow.so") in message and "not present" in message
    assert 'find_library("sessionflow") found none' in message
    assert "To fix" in message and "build-wheel.sh" in message and "set SESSIONFLOW_LIB" in message


def test_a_bundled_copy_that_cannot_load_is_reported_and_the_system_tried(tmp_path, caplog):
    (tmp_path / "libsessionflow.so").write_bytes(b"not an ELF file")
    with pytest.raises(ImportError) as error:
        _loader.load({}, tmp_path, never)
    assert "present but could not be loaded" in str(error.value)
    loaded = _loader.load({}, tmp_path, lambda name: LIBRARY)
    assert loaded.source == "system" and "could not be loaded" in caplog.text


def test_importing_without_sessionflow_lib_from_the_source_tree(tmp_path):
    """The source tree bundles no library: the import finds the system's, or fails saying why."""
    env = {k: v for k, v in os.environ.items() if k != "SESSIONFLOW_LIB"}
    env["PYTHONPATH"] = os.path.join(PYTHON_DIR, "src")
    program = (
        "import ctypes.util\n"
        "print(ctypes.util.find_library('sessionflow'))\n"
        "try:\n"
        "    import sessionflow\n"
        "    print(sessionflow.library_source)\n"
        "except ImportError as error:\n"
        "    print(type(error).__name__, error)\n"
    )
    run = subprocess.run([sys.executable, "-c", program], env=env, cwd=tmp_path, capture_output=True, text=True,
                         timeout=60)
    assert run.returncode == 0, run.stderr
    system, outcome = run.stdout.split("\n", 1)
    if system != "None":
        assert outcome.strip() == "system"
    else:
        assert outcome.startswith("LibraryNotFoundError libsessionflow not found. Tried, in this order: "
                                  "1. SESSIONFLOW_LIB: not set; 2. the bundled ")
