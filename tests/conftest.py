"""The test session's plugins: the shared fixtures and the real S3 and GCS servers, both in
tests/helpers/ (pytest puts tests/ on sys.path, so they import as ``helpers.<module>``)."""

from __future__ import annotations

pytest_plugins = ["helpers.servers", "helpers.fixtures", "helpers.mixtures"]
