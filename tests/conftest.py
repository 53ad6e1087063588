"""The test session's plugins, all in tests/helpers/ (pytest puts tests/ on sys.path, so they
import as ``helpers.<module>``): the marks' check, the real S3 and GCS servers, the shared
fixtures, and the mixture tests' sources."""

from __future__ import annotations

pytest_plugins = ["helpers.marks", "helpers.servers", "helpers.fixtures", "helpers.mixtures"]
