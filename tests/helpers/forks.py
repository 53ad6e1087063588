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
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

# The server: imports its argv's modules, then for each line of stdin ({"code", "argv", "cwd",
# "out", "err"}) forks a child that runs ``code`` as a ``python -c`` would (``sys.argv[1:]`` =
# ``argv``), its stdout written to ``out`` and its stderr to ``err``; prints the child's pid, and
# once it ends its exit code (-9: SIGKILLed), each on a line of its own.
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
            for fd, path in ((1, job["out"]), (2, job["err"])):
                os.dup2(os.open(path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644), fd)
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
    print(pid, flush=True)
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
            # Not the caller's folder: `python -c` puts it first on sys.path, over PYTHONPATH's
            # yogadl_plus (a job then finds its modules as the `python -c` it stands for would).
            cwd=tempfile.gettempdir(),
        )
        self.buffer = b""
        self.pid = 0  # the job started last

    def run(self, code: str, *argv: str, cwd: Path, log: Path, timeout: float = 300) -> int:
        """The exit code of ``python -c code *argv`` run in ``cwd`` (-9: SIGKILLed), its
        output in ``log``."""
        self.start(code, *argv, cwd=cwd, out=log)
        returncode = self.wait(timeout)
        if returncode is None:
            self.close()
            raise AssertionError(f"the job did not end in {timeout:g} s (see {log})")
        return returncode

    def start(self, code: str, *argv: str, cwd: Path, out: Path, err: Path | None = None) -> None:
        """Starts ``python -c code *argv`` in ``cwd``, its stdout into ``out``, its stderr into
        ``err`` (``out`` too, without it); one job at a time."""
        assert self.server.stdin is not None
        job = {"code": code, "argv": list(argv), "cwd": str(cwd), "out": str(out)}
        self.server.stdin.write((json.dumps({**job, "err": str(err or out)}) + "\n").encode())
        self.server.stdin.flush()
        self.pid = int(self._said(60))

    def wait(self, timeout: float) -> int | None:
        """The exit code of the job started last (-9: SIGKILLed); None if it still ran after
        ``timeout`` seconds, and was then SIGKILLed."""
        try:
            return int(self._said(timeout))
        except TimeoutError:
            os.kill(self.pid, signal.SIGKILL)
            self._said(60)
            return None

    def _said(self, timeout: float) -> str:
        """The server's next line. (Read from its pipe unbuffered: a line a buffered reader
        had taken would not wake ``select``.)"""
        assert self.server.stdout is not None
        fd = self.server.stdout.fileno()
        deadline = time.monotonic() + timeout
        while b"\n" not in self.buffer:
            ready, _, _ = select.select([fd], [], [], max(deadline - time.monotonic(), 0))
            if not ready:
                raise TimeoutError
            chunk = os.read(fd, 4096)
            assert chunk, "the job server died (its error is in the captured stderr)"
            self.buffer += chunk
        line, _, self.buffer = self.buffer.partition(b"\n")
        return line.decode()

    def close(self) -> None:
        self.server.kill()
        self.server.wait()


def read_log(log: Path) -> str:
    """The end of a job's output, for an assertion's message."""
    return log.read_text()[-3000:] if os.path.exists(log) else f"(no {log})"
