"""A version's manifest downloaded from the bucket once per machine, not once per rank.

Eight ranks of a node that call ``storage.fetch`` at the same moment would each download the
manifest (megabytes for a version of 10^4 chunks), and a thousand ranks of a hundred nodes would
hit the bucket with the same download together. Instead the processes of a machine keep, in the
local cache, the last manifest one of them downloaded and checked, with the object's URL and
token (its ETag or generation). The others ask the bucket only for the token (a HEAD) and take
the kept bytes while it is the same: never stale, since a version rebuilt in the bucket has a
manifest with another token, which is downloaded anew.

The first process holds a lock while it downloads, so that the others wait for its download
rather than make their own, but only for ``WAIT_S``: in an outage each process then rides it
out on its own, at the same time, rather than one after the other.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
from collections.abc import Callable
from typing import TypeVar

from yogadl_plus.files import write_durably
from yogadl_plus.storage.mirrorfiles import holding

__all__ = ["WAIT_S", "forget", "read_once_per_machine"]

#: How long a process waits for another of its machine downloading the same manifest.
WAIT_S = 60.0
M = TypeVar("M")
# Where the kept manifests are, under the local cache's root ('+': no dataset is named so).
_FOLDER = "+manifests"


def read_once_per_machine(
    root: str,
    name: tuple[str, str],
    url: str,
    read: Callable[[], tuple[bytes, str]],
    token: Callable[[], str | None],
    parse: Callable[[bytes], M],
) -> tuple[bytes, M]:
    """The bytes of the manifest at ``url`` (version ``name``), and ``parse`` of them (which
    raises for a damaged manifest): the bytes this machine kept when the bucket's ``token()``
    is still theirs, else ``read()`` (bytes and token), kept for the others once they parsed.
    A cache this process cannot write (mounted read-only) is read past."""
    record = _record(root, name)
    with contextlib.ExitStack() as held:
        try:
            os.makedirs(os.path.dirname(record), exist_ok=True)
            held.enter_context(holding(record + ".lock", WAIT_S, f"{record} is busy"))
        except OSError:  # (also a StorageError: another process downloading it for WAIT_S)
            data = read()[0]
            return data, parse(data)
        kept = _kept(record, url)
        if kept is not None and kept[1] == token():
            return kept[0], parse(kept[0])
        data, current = read()
        parsed = parse(data)  # (never kept damaged: the others would take it while it holds)
        header = {"url": url, "token": current, "sha256": hashlib.sha256(data).hexdigest()}
        with contextlib.suppress(OSError):  # (the others download it themselves, then)
            write_durably(record, json.dumps(header).encode() + b"\n" + data)
        return data, parsed


def forget(root: str, name: tuple[str, str]) -> None:
    """Drop what this machine kept of version ``name``'s manifest (the version was removed)."""
    record = _record(root, name)
    for path in (record, record + ".lock"):
        with contextlib.suppress(OSError):
            os.remove(path)


def _record(root: str, name: tuple[str, str]) -> str:
    dataset_id, version = name
    return os.path.join(root, _FOLDER, dataset_id, version)


def _kept(record: str, url: str) -> tuple[bytes, str] | None:
    """The manifest of ``url`` kept here, whole, and its token."""
    try:
        with open(record, "rb") as f:
            header, data = f.read().split(b"\n", 1)
        fields = json.loads(header)
        if fields["url"] == url and hashlib.sha256(data).hexdigest() == fields["sha256"]:
            return data, str(fields["token"])
    except (OSError, ValueError, KeyError, TypeError):  # none yet, or damaged: download it
        pass
    return None
