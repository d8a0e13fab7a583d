"""Runs a command in a pseudo-terminal, waits for a text, sends keys, and prints what the
terminal showed. Used to test watch-session's keys.

    python3 pty_drive.py WAIT_TEXT KEYS [AFTER_TEXT] -- command args...
Each key is sent after AFTER_TEXT (if given) appears — several texts joined by "&&" must all
appear, in any order; exits with the command's status.
"""
import os
import pty
import select
import sys
import time

def main():
    separator = sys.argv.index("--")
    wait_text, keys = sys.argv[1], sys.argv[2]
    after_text = sys.argv[3] if separator > 3 else None
    command = sys.argv[separator + 1:]
    pid, fd = pty.fork()
    if pid == 0:
        os.environ["NO_COLOR"] = "1"
        os.execvp(command[0], command)
    seen = b""

    def pump(until, timeout):
        nonlocal seen
        deadline = time.time() + timeout
        while time.time() < deadline:
            ready, _, _ = select.select([fd], [], [], 0.05)
            if ready:
                try:
                    chunk = os.read(fd, 4096)
                except OSError:
                    return False
                if not chunk:
                    return False
                seen += chunk
            if until is not None and all(part.encode() in seen for part in until.split("&&")):
                return True
        return until is None

    pump(wait_text, 15)
    for key in keys:
        os.write(fd, key.encode())
        if after_text and key != keys[-1]:
            pump(after_text, 10)
        else:
            pump(None, 0.5)
    pump(None, 5)
    _, status = os.waitpid(pid, 0)
    sys.stdout.write(seen.decode(errors="replace"))
    sys.exit(os.WEXITSTATUS(status) if os.WIFEXITED(status) else 128 + os.WTERMSIG(status))

main()
