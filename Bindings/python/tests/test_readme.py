"""The README's Python quick start runs as shown: the block after `<!-- quickstart: python -->`,
in a fresh interpreter, against the library under test."""
import os
import subprocess
import sys

import pytest

from helpers import CLIENT, REPO, call


def readme_block(marker="<!-- quickstart: python -->"):
    lines = open(os.path.join(REPO, "README.md"), encoding="utf-8").read().split("\n")
    start = lines.index(marker)
    assert lines[start + 1] == "```python"
    end = lines.index("```", start + 2)
    return "\n".join(lines[start + 2:end])


def test_the_readme_quick_start_runs_and_prints_what_it_says():
    code = readme_block()
    assert "sessionflow.Runtime()" in code
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60,
                            env={**os.environ, "PYTHONPATH": os.path.join(REPO, "Bindings", "python", "src")})
    assert result.returncode == 0, result.stderr
    # Two threads print (the state callback on the loop thread): a line's newline may come
    # after the other thread's text, so the lines are looked for without them.
    printed = result.stdout.replace("\n", "")
    assert "session: LOGGED_OUT" in printed
    assert "member-42 True" in printed


def test_the_readme_adapter_quick_start_calls_the_resource_through_httpx(server):
    """The README's httpx block, with what it leaves to the reader filled in: the test server as
    the issuer, its protected resource as the API, and tokens of a password sign-in."""
    pytest.importorskip("httpx")
    code = readme_block("<!-- quickstart: python-httpx -->")
    assert "sessionflow.httpx.Auth(runtime)" in code
    tokens = call(f"{server}/oauth/token", {"grant_type": "password", "username": "alice",
                                            "password": "correct horse", "client_id": CLIENT})
    before = call(f"{server}/__resource/stats")["ok"]
    prelude = (f"ISSUER = {server!r}\nAPI = {server + '/api/resource'!r}\n"
               f"ACCESS = {tokens['access_token']!r}\nREFRESH = {tokens['refresh_token']!r}\n")
    result = subprocess.run([sys.executable, "-c", prelude + code.replace('"my-app"', repr(CLIENT))],
                            capture_output=True, text=True, timeout=60,
                            env={**os.environ, "PYTHONPATH": os.path.join(REPO, "Bindings", "python", "src")})
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == "alice"
    assert call(f"{server}/__resource/stats")["ok"] == before + 1


def test_the_bindings_readme_shows_the_curl_clients_request_as_it_is():
    """Bindings/README.md shows one request of examples/curl_client.c (which the C suite builds
    -Werror and runs against the test server): the two must not drift apart."""
    c = open(os.path.join(REPO, "Bindings", "examples", "curl_client.c"), encoding="utf-8").read()
    begin = c.index("/* README begin")
    code = c[c.index("\n", begin) + 1:c.index("/* README end */")].rstrip("\n").split("\n")
    lines = open(os.path.join(REPO, "Bindings", "README.md"), encoding="utf-8").read().split("\n")
    start = lines.index("  <!-- quickstart: c-curl -->")
    assert lines[start + 1] == "  ```c"
    end = lines.index("  ```", start + 2)
    shown = [line[2:] if line.startswith("  ") else line for line in lines[start + 2:end]]
    assert len(code) > 20 and shown == code
