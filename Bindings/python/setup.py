"""Only what pyproject.toml cannot say: a wheel that bundles libsessionflow.so is a
*platform* wheel (py3-none-<platform>, e.g. py3-none-linux_x86_64), not py3-none-any; a
wheel without it (pip install of this directory, the library found through SESSIONFLOW_LIB
or the system) stays pure. The bindings are ctypes: no CPython ABI is involved, so any
Python 3 of the platform can use it."""
import os

from setuptools import Distribution, setup

try:
    from setuptools.command.bdist_wheel import bdist_wheel  # setuptools >= 70.1
except ImportError:  # older setuptools: the `wheel` package's
    from wheel.bdist_wheel import bdist_wheel  # pyproject.toml's build requirements include it

BUNDLED = os.path.join(os.path.dirname(os.path.abspath(__file__)), "src", "sessionflow", "_lib", "libsessionflow.so")


class BundlingDistribution(Distribution):
    def has_ext_modules(self):
        # A native library inside: installed as platform-specific (platlib, Root-Is-Purelib false).
        return os.path.exists(BUNDLED)


class PlatformWheel(bdist_wheel):
    def get_tag(self):
        python, abi, platform = super().get_tag()
        if os.path.exists(BUNDLED):
            return "py3", "none", platform
        return python, abi, platform


setup(distclass=BundlingDistribution, cmdclass={"bdist_wheel": PlatformWheel})
