"""The package's version: the header's SF_VERSION_MAJOR.MINOR.PATCH (Bindings/include/sessionflow.h,
the project's one version, scripts/version.sh).

In the source tree it is read from the header, three directories up; in a built package (wheel,
sdist) setup.py has replaced this file by the number itself. tests/test_packaging.py checks that
it equals the header's macros and the library's sf_version_string()."""
import os
import re


def _from_header() -> str:
    header = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "..", "include", "sessionflow.h")
    with open(header, encoding="utf-8") as file:
        text = file.read()
    parts = []
    for part in ("MAJOR", "MINOR", "PATCH"):
        found = re.search(rf"^#define SF_VERSION_{part} (\d+)$", text, re.M)
        if found is None:
            raise ImportError(f"sessionflow: {header} defines no SF_VERSION_{part}")
        parts.append(found.group(1))
    return ".".join(parts)


__version__ = _from_header()
