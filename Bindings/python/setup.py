"""Only what pyproject.toml cannot say.

The version is the header's SF_VERSION_MAJOR.MINOR.PATCH (../include/sessionflow.h, the
project's one version); built packages get it written into sessionflow/_version.py (a wheel's
build_py, an sdist's release tree), and setup.py run from an sdist reads it back from there.

A wheel that bundles libsessionflow.so is a *platform* wheel (py3-none-<platform>, e.g.
py3-none-linux_x86_64), not py3-none-any. Without the library there is nothing to load, so a
plain `python -m build` / `pip wheel .` stops and says how to build the real wheel; a wheel
without the library (the library found through SESSIONFLOW_LIB or the system) is built only on
request, SESSIONFLOW_WHEEL=pure. The bindings are ctypes: no CPython ABI is involved, so any
Python 3 of the platform can use it."""
import os
import re

from setuptools import Distribution, setup
from setuptools.command.build_py import build_py
from setuptools.command.sdist import sdist

try:
    from setuptools.command.bdist_wheel import bdist_wheel  # setuptools >= 70.1
except ImportError:  # older setuptools: the `wheel` package's
    from wheel.bdist_wheel import bdist_wheel

HERE = os.path.dirname(os.path.abspath(__file__))
BUNDLED = os.path.join(HERE, "src", "sessionflow", "_lib", "libsessionflow.so")
HEADER = os.path.join(HERE, "..", "include", "sessionflow.h")
VERSION_FILE = os.path.join("sessionflow", "_version.py")
HOW = """sessionflow: no libsessionflow.so to bundle (src/sessionflow/_lib/), and a wheel without it
cannot load. Build the real wheel with one of:
  bash scripts/package.sh OUTDIR          (repository root: the manylinux wheel, libuv and
                                          libcurl bundled, with the .debs and the archive)
  bash Bindings/python/build-wheel.sh LIBRARY OUTDIR   (bundles LIBRARY; this machine only)
or, for a package that finds the library through SESSIONFLOW_LIB or the system, build with
SESSIONFLOW_WHEEL=pure."""


def version():
    if os.path.exists(HEADER):
        text = open(HEADER, encoding="utf-8").read()
        parts = [re.search(rf"^#define SF_VERSION_{p} (\d+)$", text, re.M) for p in ("MAJOR", "MINOR", "PATCH")]
        if None in parts:
            raise SystemExit(f"sessionflow: {HEADER} lacks an SF_VERSION_* macro")
        return ".".join(p.group(1) for p in parts)
    # An sdist: its _version.py holds the number (written by the sdist command below).
    text = open(os.path.join(HERE, "src", VERSION_FILE), encoding="utf-8").read()
    found = re.search(r'^__version__ = "([0-9.]+)"$', text, re.M)
    if found is None:
        raise SystemExit(f"sessionflow: no {HEADER} and no version in src/{VERSION_FILE}")
    return found.group(1)


VERSION = version()
STAMP = f'"""The header\'s SF_VERSION_MAJOR.MINOR.PATCH, written by setup.py."""\n__version__ = "{VERSION}"\n'


class BundlingDistribution(Distribution):
    def has_ext_modules(self):
        # A native library inside: installed as platform-specific (platlib, Root-Is-Purelib false).
        return os.path.exists(BUNDLED)


class StampedBuild(build_py):
    def run(self):
        super().run()
        with open(os.path.join(self.build_lib, VERSION_FILE), "w", encoding="utf-8") as file:
            file.write(STAMP)


class StampedSdist(sdist):
    def make_release_tree(self, base_dir, files):
        super().make_release_tree(base_dir, files)
        target = os.path.join(base_dir, "src", VERSION_FILE)
        os.remove(target)  # a hard link to the source tree's file: never written through
        with open(target, "w", encoding="utf-8") as file:
            file.write(STAMP)


class PlatformWheel(bdist_wheel):
    def run(self):
        if not os.path.exists(BUNDLED) and os.environ.get("SESSIONFLOW_WHEEL") != "pure":
            raise SystemExit(HOW)
        super().run()

    def get_tag(self):
        python, abi, platform = super().get_tag()
        if os.path.exists(BUNDLED):
            return "py3", "none", platform
        return python, abi, platform


setup(version=VERSION, distclass=BundlingDistribution,
      cmdclass={"build_py": StampedBuild, "sdist": StampedSdist, "bdist_wheel": PlatformWheel})
