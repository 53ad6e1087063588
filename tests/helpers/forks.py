"""Jobs in fresh processes without a fresh interpreter's imports each time.

A test that kills a job (SIGKILL at a chosen step) runs it in a process of its own; started with
``sys.executable``, each such process paid the seconds of importing numpy, yogadl_plus or
TensorFlow again. :class:`Forks` starts one server process that imports those modules once, and
forks it for each job: every job is still a process of its own, with its own memory, killed as a
whole, and the server runs nothing but imports (no thread, no framework runtime) before forking.
"""

from __future__ import annotations

import json
import os
import select
import subprocess
import sys
import tempfile
from pathlib import Path

# The server: imports its argv's modules, then for each line of stdin ({"code", "argv", "cwd",
# "log"}) forks a child that runs ``code`` as a ``python -c`` would (``sys.argv[1:]`` =
# ``argv``), its stdout and stderr written to ``log``; prints the child's exit code (-9:
# SIGKILLed) on a line of its own.
SERVER = r"""
import json, os, sys, traceback

for module in sys.argv[1:]:
    __import__(module)
for line in sys.stdin:
    job = json.loads(line)
    pid = os.fork()
    if pid == 0:
        code = 1
        try:
            out = os.open(job["log"], os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
            os.dup2(out, 1)
            os.dup2(out, 2)
            os.chdir(job["cwd"])
            sys.argv = ["-c", *job["argv"]]
            exec(compile(job["code"], "<job>", "exec"), {"__name__": "__main__"})
            code = 0
        except SystemExit as exit:
            code = exit.code if isinstance(exit.code, int) else 1
        except BaseException:
            traceback.print_exc()
        finally:
            sys.stdout.flush()
            sys.stderr.flush()
            os._exit(code)
    _, status = os.waitpid(pid, 0)
    print(os.waitstatus_to_exitcode(status), flush=True)
"""


class Forks:
    """A server that has imported ``modules`` and runs each job in a process forked from it."""

    def __init__(self, *modules: str, env: dict[str, str] | None = None) -> None:
        self.server = subprocess.Popen(
            [sys.executable, "-c", SERVER, *modules],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            env=env,
            text=True,
            # Not the caller's folder: `python -c` puts it first on sys.path, over PYTHONPATH's
            # yogadl_plus (a job then finds its modules as the `python -c` it stands for would).
            cwd=tempfile.gettempdir(),
        )

    def run(self, code: str, *argv: str, cwd: Path, log: Path, timeout: float = 300) -> int:
        """The exit code of ``python -c code *argv`` run in ``cwd`` (-9: SIGKILLed), its
        output in ``log``."""
        assert self.server.stdin is not None and self.server.stdout is not None
        job = {"code": code, "argv": list(argv), "cwd": str(cwd), "log": str(log)}
        self.server.stdin.write(json.dumps(job) + "\n")
        self.server.stdin.flush()
        ready, _, _ = select.select([self.server.stdout], [], [], timeout)
        if not ready:
            self.close()
            raise AssertionError(f"the job did not end in {timeout:g} s (see {log})")
        said = self.server.stdout.readline()
        assert said, "the job server died (its error is in the captured stderr)"
        return int(said)

    def close(self) -> None:
        self.server.kill()
        self.server.wait()


def read_log(log: Path) -> str:
    """The end of a job's output, for an assertion's message."""
    return log.read_text()[-3000:] if os.path.exists(log) else f"(no {log})"
