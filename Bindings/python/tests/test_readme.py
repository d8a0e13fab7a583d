"""The README's Python quick start runs as shown: the block after `<!-- quickstart: python -->`,
in a fresh interpreter, against the library under test."""
import os
import subprocess
import sys

from helpers import REPO


def readme_block():
    lines = open(os.path.join(REPO, "README.md"), encoding="utf-8").read().split("\n")
    start = lines.index("<!-- quickstart: python -->")
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
