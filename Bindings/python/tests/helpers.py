"""Shared by the tests (importable: pytest puts this directory on sys.path)."""
import os
import time

REPO = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", "..", ".."))
PYTHON_DIR = os.path.join(REPO, "Bindings", "python")
HEADER = os.path.join(REPO, "Bindings", "include", "sessionflow.h")


def wait_for(condition, timeout=10.0):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if condition():
            return True
        time.sleep(0.002)
    return condition()
