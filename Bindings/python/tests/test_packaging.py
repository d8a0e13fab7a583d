"""The package: its version is the header's and the library's; the wheel bundles the library
and imports without SESSIONFLOW_LIB in a fresh virtual environment; nothing generated is
committed."""
import os
import re
import shutil
import subprocess
import sys
import sysconfig
import zipfile

import pytest

import sessionflow as sf
from helpers import HEADER, PYTHON_DIR, REPO

SCRIPT = os.path.join(PYTHON_DIR, "build-wheel.sh")


def header_version():
    text = open(HEADER).read()
    parts = [re.search(rf"#define SF_VERSION_{p} (\d+)", text).group(1) for p in ("MAJOR", "MINOR", "PATCH")]
    return ".".join(parts)


def test_the_version_is_the_headers_the_librarys_and_the_packages():
    pyproject = open(os.path.join(PYTHON_DIR, "pyproject.toml")).read()
    # pyproject.toml has no version of its own: setup.py gives the header's (one place)...
    assert re.search(r'^dynamic = \["version"\]$', pyproject, re.M)
    assert not re.search(r'^version\s*=', pyproject, re.M)
    given = subprocess.run([sys.executable, "setup.py", "--version"], cwd=PYTHON_DIR, capture_output=True,
                           text=True, timeout=120)
    assert given.returncode == 0, given.stderr
    # ...which is the header's SF_VERSION_* and the library's
    assert given.stdout.split()[-1] == sf.__version__ == header_version() == sf.version()
    assert sf.version_info() == tuple(int(p) for p in header_version().split("."))


def test_generated_files_are_ignored_by_git():
    paths = ["src/sessionflow/_lib/libsessionflow.so", "build/lib/x.py", "dist/x.whl",
             "src/sessionflow.egg-info/PKG-INFO", "src/sessionflow/__pycache__/x.pyc"]
    run = subprocess.run(["git", "check-ignore", "--no-index", *paths], cwd=PYTHON_DIR, capture_output=True,
                         text=True)
    if run.returncode == 128:
        pytest.skip(f"not a git work tree: {run.stderr.strip()}")
    assert sorted(run.stdout.split()) == sorted(paths)


def test_a_wheel_without_the_library_stops_and_says_how(tmp_path):
    # What `python -m build` / `pip wheel .` do in Bindings/python: no library to bundle, so no
    # wheel that could not load; on request (SESSIONFLOW_WHEEL=pure) the pure package, its
    # version written in.
    copy = tmp_path / "Bindings"
    shutil.copytree(PYTHON_DIR, copy / "python", ignore=shutil.ignore_patterns(
        "__pycache__", "_lib", "*.egg-info", "build", "dist", ".mypy_cache", ".pytest_cache"))
    shutil.copytree(os.path.dirname(HEADER), copy / "include")
    command = [sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation", "--no-index",
               "--wheel-dir", str(tmp_path / "dist"), str(copy / "python")]
    env = {k: v for k, v in os.environ.items() if k != "SESSIONFLOW_WHEEL"}
    refused = subprocess.run(command, env=env, capture_output=True, text=True, timeout=300)
    assert refused.returncode != 0
    assert "no libsessionflow.so to bundle" in refused.stdout + refused.stderr
    assert "bash scripts/package.sh OUTDIR" in refused.stdout + refused.stderr
    assert not (tmp_path / "dist").exists() or not list((tmp_path / "dist").glob("*.whl"))

    pure = subprocess.run(command, env=dict(env, SESSIONFLOW_WHEEL="pure"), capture_output=True, text=True,
                          timeout=300)
    assert pure.returncode == 0, pure.stderr
    wheel = tmp_path / "dist" / f"sessionflow-{header_version()}-py3-none-any.whl"
    stamped = zipfile.ZipFile(wheel).read("sessionflow/_version.py").decode()
    assert f'__version__ = "{header_version()}"' in stamped


def test_build_wheel_needs_its_two_arguments():
    run = subprocess.run(["bash", SCRIPT], capture_output=True, text=True)
    assert run.returncode == 2 and "LIBRARY" in run.stderr and "OUTDIR" in run.stderr


def source_tree_files():
    found = set()
    for root, dirs, files in os.walk(PYTHON_DIR):
        dirs[:] = [d for d in dirs if d not in ("__pycache__", ".pytest_cache", ".mypy_cache")]
        found.update(os.path.relpath(os.path.join(root, f), PYTHON_DIR) for f in files)
    return found


def test_the_wheel_bundles_the_library_and_imports_without_sessionflow_lib(tmp_path):
    library = os.environ.get("SESSIONFLOW_LIB")
    if not library:
        pytest.skip("SESSIONFLOW_LIB is not set: no library to bundle (run with SESSIONFLOW_LIB=path/to/libsessionflow.so)")
    before = source_tree_files()
    build = subprocess.run(["bash", SCRIPT, library, str(tmp_path / "dist")], capture_output=True, text=True,
                           timeout=300)
    assert build.returncode == 0, build.stderr
    wheel = build.stdout.strip().splitlines()[-1]
    assert source_tree_files() == before  # nothing written into the source tree

    # a platform wheel, not py3-none-any: it holds a native library
    platform = sysconfig.get_platform().replace("-", "_").replace(".", "_")
    assert os.path.basename(wheel) == f"sessionflow-{sf.__version__}-py3-none-{platform}.whl"
    names = zipfile.ZipFile(wheel).namelist()
    assert {"sessionflow/_lib/libsessionflow.so", "sessionflow/py.typed", "sessionflow/__init__.py"} <= set(names)

    venv = tmp_path / "venv"
    subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True, timeout=300)
    python = str(venv / "bin" / "python")
    install = subprocess.run([python, "-m", "pip", "install", "--no-index", "--no-deps", "--quiet", wheel],
                             capture_output=True, text=True, timeout=300)
    assert install.returncode == 0, install.stderr

    env = {k: v for k, v in os.environ.items() if k not in ("SESSIONFLOW_LIB", "PYTHONPATH", "LD_LIBRARY_PATH")}
    program = (
        "import sessionflow, os\n"
        "print(sessionflow.version())\n"
        "print(sessionflow.library_source)\n"
        "print(os.path.realpath(sessionflow.library_path))\n"
        "print(os.path.realpath(sessionflow.__file__))\n"
        "runtime = sessionflow.Runtime()\n"
        "print(runtime.state.name)\n"
        "print(runtime.destroy())\n"
    )
    run = subprocess.run([python, "-c", program], env=env, cwd=tmp_path, capture_output=True, text=True, timeout=120)
    assert run.returncode == 0, run.stderr
    version, source, path, module, state, unclosed = run.stdout.split()
    site = os.path.realpath(str(venv))
    assert version == sf.__version__ and source == "bundled" and state == "LOGGED_OUT" and unclosed == "0"
    assert path.startswith(site) and path.endswith("sessionflow/_lib/libsessionflow.so")
    assert module.startswith(site)  # the installed package, not this source tree
