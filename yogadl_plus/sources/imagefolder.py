"""A folder of image files in class subfolders, torchvision's ``ImageFolder`` layout
(``root/<class>/**/<file>``), on local disk or in a bucket, each file cached as it is."""

from __future__ import annotations

import hashlib
import os
import posixpath
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from yogadl_plus.errors import YogaError
from yogadl_plus.schema import Field, Schema
from yogadl_plus.sources.base import Piece, Source, even_cuts
from yogadl_plus.sources.imagebytes import IMAGE_EXTENSIONS, checked_image, image_field
from yogadl_plus.sources.locations import list_folder, read_file, resolve_paths, url_of

__all__ = ["ImageFolder"]


@dataclass(frozen=True)
class ImageFile:
    """One image of the folder: its path below the root (posix), its class's index, and what
    the listing said of it (for the fingerprint)."""

    path: str
    label: int
    size: int
    mtime_ns: int | None


def _folder_schema() -> Schema:
    return Schema([image_field("image"), Field("label", np.int64), Field("path", str)])


class ImageFolder(Source):
    """The image files of ``root/<class>/**/<file>``, a local folder or an ``s3://`` /
    ``gs://`` prefix: one record per file, ``{"image": the file's bytes, "label": the class's
    index in ``classes``, "path": the file's path below root}``.

    As torchvision's ``ImageFolder``: the classes are the folders in ``root``, sorted by name;
    a file is an image by its extension (``extensions``, compared in lower case); records come
    class by class, each class's files in the order of a sorted walk of its folder. Unlike it,
    hidden files and folders (``.name``) are left out, and so is nothing else. Each file is
    checked when cached: one that does not decode is a YogaError naming it, and nothing is
    cached. The folder is listed once, here; ``filesystem`` (a ``pyarrow.fs`` filesystem)
    reads a bucket with an endpoint and credentials of your own.
    """

    kind = "imagefolder"

    def __init__(
        self,
        root: str | os.PathLike[str],
        *,
        extensions: Sequence[str] = IMAGE_EXTENSIONS,
        filesystem: Any = None,
    ) -> None:
        if isinstance(extensions, str):
            raise TypeError(f"extensions= takes a sequence of extensions, got {extensions!r}")
        self.extensions = tuple(
            e.lower() if e.startswith(".") else f".{e.lower()}" for e in extensions
        )
        self.filesystem, (named,) = resolve_paths(root, filesystem, "ImageFolder")
        self.root = named.rstrip("/") or "/"
        self.url = url_of(self.filesystem, self.root)
        self.classes, self.files = self._listed()

    def __repr__(self) -> str:
        return f"ImageFolder({self.url!r}: {len(self.files)} images, {len(self.classes)} classes)"

    @property
    def class_to_idx(self) -> dict[str, int]:
        """Class name -> label, as torchvision's ``ImageFolder.class_to_idx``."""
        return {name: index for index, name in enumerate(self.classes)}

    def _listed(self) -> tuple[list[str], list[ImageFile]]:
        """(the sorted class names, the images in storage order), or a YogaError saying why the
        folder is no ImageFolder."""
        import pyarrow.fs as pafs

        info = self.filesystem.get_file_info(self.root)
        if info.type != pafs.FileType.Directory:
            what = "is a file" if info.type == pafs.FileType.File else "does not exist"
            raise YogaError(f"ImageFolder {self.url!r} {what}: pass the folder of class folders")
        found = list_folder(self.filesystem, pafs.FileSelector(self.root, recursive=True))
        entries = [(self._below(i.path), i) for i in found]
        entries = [
            (rel, i) for rel, i in entries if not any(p.startswith(".") for p in rel.split("/"))
        ]
        if self.filesystem.type_name == "local":
            self._refuse_folders_seen_twice(
                [i.path for _, i in entries if i.type == pafs.FileType.Directory]
            )
        classes = sorted(
            {
                rel.split("/")[0]
                for rel, i in entries
                if "/" in rel or i.type == pafs.FileType.Directory
            }
        )
        images = {
            rel: i
            for rel, i in entries
            if i.is_file and "/" in rel and rel.lower().endswith(self.extensions)
        }
        if not classes:
            loose = sum(i.is_file for rel, i in entries)
            raise YogaError(
                f"ImageFolder {self.url!r} holds no class folder ({loose} files directly in it): "
                "the layout is root/<class>/<image>, one folder per class"
            )
        labels = {name: index for index, name in enumerate(classes)}
        # A sorted walk of each class folder (torchvision's order): folder by folder, each
        # folder's files by name.
        order = sorted(images, key=lambda rel: (labels[rel.split("/")[0]], *posixpath.split(rel)))
        files = [
            ImageFile(rel, labels[rel.split("/")[0]], images[rel].size, images[rel].mtime_ns)
            for rel in order
        ]
        empty = sorted(set(classes) - {rel.split("/")[0] for rel in images})
        if empty:
            raise YogaError(
                f"ImageFolder {self.url!r}: the class folder(s) {empty[:5]} hold no image file "
                f"({', '.join(self.extensions)}; {len(empty)} such classes): add images or "
                "remove the folders (their labels would stand for nothing)"
            )
        return classes, files

    def _refuse_folders_seen_twice(self, folders: list[str]) -> None:
        """A YogaError where two listed folders are one on disk (a link to a folder above it,
        which a walk follows round and round, or two links to one folder): each image there
        would be cached again under every name."""
        seen: dict[str, str] = {}
        for folder in folders:
            real = os.path.realpath(folder)
            if real in seen:
                raise YogaError(
                    f"ImageFolder {self.url!r}: {self._below(folder)!r} and "
                    f"{self._below(seen[real])!r} are the same folder ({real}), through a "
                    "symbolic link: its images would be cached once per name; remove the link"
                )
            seen[real] = folder

    def _below(self, path: str) -> str:
        return path[len(self.root) :].lstrip("/")

    @property
    def schema(self) -> Schema:
        return _folder_schema()

    @property
    def length(self) -> int:
        return len(self.files)

    def fingerprint(self) -> str:
        """The root, and each image's path, size and modification time."""
        digest = hashlib.sha256(f"{self.url}\n".encode())
        for image in self.files:
            digest.update(f"{image.path}\0{image.size}\0{image.mtime_ns}\n".encode())
        return "imagefolder-sha256:" + digest.hexdigest()[:32]

    def records(self) -> Iterator[dict[str, Any]]:
        return _ImageFiles(self.filesystem, self.root, self.files, 0).records()

    def split(self, parts: int) -> list[Source]:
        """Runs of consecutive files, of nearly equal bytes."""
        return [
            _ImageFiles(self.filesystem, self.root, self.files[run.start : run.stop], run.start)
            for run in even_cuts([image.size for image in self.files], parts)
        ]


class _ImageFiles(Piece):
    """Some consecutive images of an ImageFolder, from the ``start``-th on, read and checked."""

    kind = "imagefolder"

    def __init__(self, filesystem: Any, root: str, files: list[ImageFile], start: int) -> None:
        super().__init__(_folder_schema(), start, len(files))
        self.filesystem = filesystem
        self.root = root
        self.files = files

    def __repr__(self) -> str:
        return f"<ImageFolder files {self.start}..{self.start + self.rows} of {self.root}>"

    def records(self) -> Iterator[dict[str, Any]]:
        where = url_of(self.filesystem, self.root)
        for image in self.files:
            data = read_file(self.filesystem, f"{self.root}/{image.path}")
            yield {
                "image": checked_image(data, f"{image.path} (in ImageFolder {where})"),
                "label": np.int64(image.label),
                "path": image.path,
            }
