"""Sessions: tests (the CI job), quick (the tests a change is checked with as it is made), lint
(ruff + mypy), bench (foundation benchmarks), docs."""

from __future__ import annotations

import tempfile

import nox

nox.options.sessions = ["tests"]
nox.options.reuse_existing_virtualenvs = True

CONSTRAINTS = ("-c", "constraints.txt")
# The marks (pyproject.toml) of the tests the quick session leaves out.
NOT_QUICK = "not (servers or ray or spark or crash or slow)"


def install_for_tests(session: nox.Session) -> None:
    """The package with its test extras, in the session's virtual environment."""
    # torch first, pinned: the CPU wheel; anything that pulls torch later then finds it there.
    # (pip is quiet under nox: say what the first, long step is doing.)
    session.log("installing torch (the CPU wheel), then every framework the tests use:")
    session.log("about 7 minutes on a fresh machine, without output; seconds once installed")
    session.install(*CONSTRAINTS, "torch")
    session.install(*CONSTRAINTS, "-e", ".[test]")


@nox.session
def tests(session: nox.Session) -> None:
    """Install the package with its test extras and run every test."""
    install_for_tests(session)
    session.log("running every test (about 15 minutes on 2 cores)")
    session.run("pytest", "-q", "-p", "no:cacheprovider", *session.posargs)


@nox.session
def quick(session: nox.Session) -> None:
    """Every test but those marked servers, ray, spark, crash or slow: a few minutes."""
    install_for_tests(session)
    session.log(f"running the tests selected by -m {NOT_QUICK!r} (under 5 minutes on 2 cores)")
    session.run("pytest", "-q", "-p", "no:cacheprovider", "-m", NOT_QUICK, *session.posargs)


@nox.session
def lint(session: nox.Session) -> None:
    # mypy checks the adapters against the real frameworks (torch first: the CPU wheel).
    session.install(*CONSTRAINTS, "torch")
    session.install(*CONSTRAINTS, "-e", ".[lint,tf,torch,s3,gcs,ray,spark,hf,grain]")
    session.run("ruff", "check", "yogadl_plus", "tests", "bench", "examples")
    session.run("ruff", "format", "--check", "yogadl_plus")
    session.run("mypy")


@nox.session
def bench(session: nox.Session) -> None:
    """The foundation benchmarks; pass --quick after -- for the small sizes only."""
    session.install(*CONSTRAINTS, "-e", ".")
    session.run("python", "-m", "bench.bench_foundation", *session.posargs)


@nox.session
def docs(session: nox.Session) -> None:
    """Build the documentation site with mkdocs --strict: a broken link or anchor fails it."""
    session.install(*CONSTRAINTS, "-e", ".[docs]")
    with tempfile.TemporaryDirectory(prefix="yogadl_plus_site_") as site:
        session.run("mkdocs", "build", "--strict", "-d", site, *session.posargs)
