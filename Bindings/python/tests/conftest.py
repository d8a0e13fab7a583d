import os
import sys

import pytest

from helpers import oauth_server  # this directory is on sys.path (pytest's rootdir conftest)

# The package from this source tree (src layout). Its library: SESSIONFLOW_LIB (or, without it,
# the system's: see sessionflow._loader).
sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "src"))


@pytest.fixture(scope="module")
def server():
    """The real OAuth 2.0 test server (Authlib + Flask), one per test module that asks for it:
    its base URL."""
    pytest.importorskip("authlib")
    with oauth_server() as url:
        yield url
