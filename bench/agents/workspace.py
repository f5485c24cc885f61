"""The small git repository each agent works in, and the tasks it is given: each needs several
tool steps (read a file, edit it, run a command); the second is of the same kind as the first,
the third follows on from the session before it."""

from __future__ import annotations

import subprocess
from pathlib import Path

FILES = {
    "calc.py": "def add(a, b):\n    return a - b\n",
    "check.py": 'from calc import add\n\nprint("OK" if add(2, 3) == 5 else "WRONG")\n',
    "README.md": "# calc\n\nA tiny calculator. `python check.py` prints OK when it works.\n",
}

# NOTE: (session, task, resumed): a fresh session, a new session of the same kind of task, and
# the most recent session resumed (``claude --continue``, ``codex exec resume --last``)
SESSIONS = (
    (
        "fresh",
        "Read calc.py, fix the bug in add so that `python check.py` prints OK, then run `python check.py`.",
        False,
    ),
    ("new", "Read calc.py, add a function mul(a, b) that returns a * b, then run `python check.py`.", False),
    (
        "resumed",
        "Now read check.py, add a check of mul(2, 3) == 6 to it, and run `python check.py` again.",
        True,
    ),
)


def make_repo(path: Path) -> Path:
    """A git repository at ``path`` holding ``FILES`` in one commit (no global git config read)."""
    path.mkdir(parents=True)
    for name, text in FILES.items():
        (path / name).write_text(text)
    git = [
        "git",
        "-c",
        "user.name=bench",
        "-c",
        "user.email=bench@localhost",
        "-c",
        "init.defaultBranch=main",
    ]
    for args in (["init", "-q"], ["add", "."], ["commit", "-qm", "calc"]):
        subprocess.run([*git, *args], cwd=path, check=True, capture_output=True)
    return path
