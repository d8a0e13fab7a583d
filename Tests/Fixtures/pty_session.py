"""Runs a command in a pseudo-terminal (its controlling terminal) and relays: what the
terminal shows goes to our stdout as it comes, our stdin goes to the terminal (so a test types
keys, and Ctrl-C as the byte 0x03 is turned into SIGINT by the terminal, as for a person).

    python3 pty_session.py -- command args...

Exits with the command's status (128 + N if a signal N ended it). Used by watch-session's
login tests, which must read the screen while the command runs (pty_drive.py prints it only
at the end).
"""
import os
import pty
import select
import sys


def main():
    command = sys.argv[sys.argv.index("--") + 1:]
    pid, fd = pty.fork()
    if pid == 0:
        os.environ["NO_COLOR"] = "1"
        os.execvp(command[0], command)
    stdin_open = True
    while True:
        watched = [fd] + ([0] if stdin_open else [])
        ready, _, _ = select.select(watched, [], [], 0.05)
        if fd in ready:
            try:
                chunk = os.read(fd, 4096)
            except OSError:
                chunk = b""
            if not chunk:
                break
            os.write(1, chunk)
        if 0 in ready:
            data = os.read(0, 1024)
            if data:
                os.write(fd, data)
            else:
                stdin_open = False
    _, status = os.waitpid(pid, 0)
    sys.exit(os.WEXITSTATUS(status) if os.WIFEXITED(status) else 128 + os.WTERMSIG(status))


main()
