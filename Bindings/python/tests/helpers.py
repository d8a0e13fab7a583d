"""Shared by the tests (importable: pytest puts this directory on sys.path)."""
import contextlib
import json
import os
import subprocess
import sys
import time
import urllib.error
import urllib.parse
import urllib.request

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


FIXTURE = os.path.join(REPO, "Tests", "Fixtures", "oauth_server.py")
CLIENT = "sessionflow-public"  # the test server's public client


@contextlib.contextmanager
def oauth_server():
    """The real OAuth 2.0 test server (Authlib + Flask) on a loopback port: its base URL."""
    process = subprocess.Popen([sys.executable, FIXTURE], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                               stderr=subprocess.DEVNULL, text=True)
    try:
        port = int(process.stdout.readline().split()[1])
        yield f"http://127.0.0.1:{port}"
    finally:
        process.kill()
        process.wait()


def call(url, form=None):
    """A request to the test server's hooks: the JSON it answers (an HTTP error's too)."""
    data = urllib.parse.urlencode(form).encode() if form is not None else None
    try:
        with urllib.request.urlopen(url, data) as response:
            return json.load(response)
    except urllib.error.HTTPError as error:
        return json.load(error)
