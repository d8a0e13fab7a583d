"""The binding's version: the header's SF_VERSION_MAJOR.MINOR.PATCH it was written against.

pyproject.toml reads it from here (one place); tests/test_packaging.py checks that it equals
the header's macros and the library's sf_version_string()."""

__version__ = "0.2.0"
