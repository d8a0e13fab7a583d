"""Shared by the tests (importable: pytest puts this directory on sys.path)."""
import contextlib
import http.server
import json
import os
import subprocess
import sys
import threading
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


@contextlib.contextmanager
def loopback(answer):
    """A plain HTTP server on a loopback port, in a thread: `answer(request)` gives the (status,
    headers) to answer each request with. Yields its base URL and the list of the requests it
    got, each a dict: method, path, headers (the names, lowercase: never the values, which may
    be secrets) and body (bytes; a chunked one decoded)."""
    seen = []

    class Handler(http.server.BaseHTTPRequestHandler):
        def handle_one(self):
            request = {"method": self.command, "path": self.path, "body": self.read_body(),
                       "headers": {name.lower() for name in self.headers.keys()}}
            seen.append(request)
            status, headers = answer(request)
            self.send_response(status)
            for name, value in headers.items():
                self.send_header(name, value)
            self.send_header("Content-Length", "0")
            self.end_headers()

        do_GET = do_POST = do_PUT = handle_one

        def read_body(self):
            if self.headers.get("Transfer-Encoding", "").lower() == "chunked":
                parts = []
                while True:
                    size = int(self.rfile.readline().split(b";")[0], 16)
                    if size == 0:
                        while self.rfile.readline() not in (b"\r\n", b"\n", b""):
                            pass  # trailers
                        return b"".join(parts)
                    parts.append(self.rfile.read(size))
                    self.rfile.readline()
            return self.rfile.read(int(self.headers.get("Content-Length") or 0))

        def log_message(self, *args):
            pass

    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    server.daemon_threads = True
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}", seen
    finally:
        server.shutdown()
        server.server_close()
        thread.join()
