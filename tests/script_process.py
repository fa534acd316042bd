"""A Python script run as a real process and driven line by line over stdin: each command is answered by one
line starting with ``ok`` (the replica tests of the state directory and of Redis)."""
from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]


class ScriptProcess:
    def __init__(self, script: str, *args: str, **env: str) -> None:
        self.proc = subprocess.Popen([sys.executable, "-c", script, *args], stdin=subprocess.PIPE,
                                     stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                                     env={**os.environ, "PYTHONPATH": str(REPO), **env})
        self.greeting = self._answer()

    def _answer(self) -> str:
        """The text after ``ok`` of the next line; the script's stderr in the error when it answers otherwise."""
        line = self.proc.stdout.readline()
        if not line.startswith("ok"):
            self.proc.kill()
            raise AssertionError(f"script process: {line!r} {self.proc.stderr.read()[-3000:]}")
        return line[2:].strip()

    def do(self, command: str) -> str:
        self.proc.stdin.write(command + "\n")
        self.proc.stdin.flush()
        return self._answer()
