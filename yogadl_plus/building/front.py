"""cache_dataset: read a source once into a published, versioned cache."""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from yogadl_plus.building.changes import check_schema, warn_if_changed
from yogadl_plus.building.plan import BuildPlan
from yogadl_plus.building.starts import refuse_while_a_worker_starts
from yogadl_plus.cache.manifest import Manifest
from yogadl_plus.cache.writer import DEFAULT_CHUNK_BYTES
from yogadl_plus.checks import check_int
from yogadl_plus.schema import Schema
from yogadl_plus.sources import as_source
from yogadl_plus.sources.spark import SparkDataFrameSource
from yogadl_plus.storage import check_name, default_storage

if TYPE_CHECKING:
    from yogadl_plus.dataref import DataRef
    from yogadl_plus.storage.base import Storage

__all__ = ["ENGINES", "cache_dataset"]

ENGINES = ("local", "ray")


def cache_dataset(
    source: Any,
    dataset_id: str,
    version: str,
    storage: Storage | None = None,
    *,
    schema: Schema | None = None,
    overwrite: bool = False,
    progress: bool = True,
    chunk_bytes: int = DEFAULT_CHUNK_BYTES,
    workers: int | None = None,
    engine: str = "local",
    on_transfer: Callable[[int], object] | None = None,
) -> DataRef:
    """Cache ``source`` as (dataset_id, version) in ``storage`` and return its DataRef.

    If the version exists, the source is not read (unless ``overwrite``). Only one builder of a
    version runs at a time; concurrent callers wait and read what it published. A version that
    exists is compared with what the source tells without being read (its fingerprint, length
    and schema, where it knows them): a SourceChangedWarning names each difference, and a
    ``schema=`` that contradicts the cached schema is a SchemaError.

    ``workers=k`` builds with a pool of k processes, and ``engine="ray"`` with Ray tasks on the
    cluster that ``ray.init()`` joins (``workers`` then caps the tasks in flight): the source is
    cut into parts (Parquet row groups, index ranges of a map-style dataset, blocks of a
    ``ray.data.Dataset``), each task writes its part's chunks, and the result equals a serial
    build record for record. A Spark DataFrame is always built by Spark's executors, one task
    per partition, in partition order. ``on_transfer(bytes)`` is called after each chunk a
    bucket storage uploads or downloads (for a progress bar), from its transfer threads.
    """
    refuse_while_a_worker_starts()
    check_name("dataset_id", dataset_id)
    check_name("version", version)
    workers = _checked_runner(engine, workers)
    store = storage if storage is not None else default_storage()
    src = as_source(source, schema)
    if isinstance(src, SparkDataFrameSource) and (engine != "local" or workers is not None):
        raise ValueError(
            "a Spark DataFrame is built by Spark, one task per partition: leave out workers= "
            "and engine= (repartition the DataFrame to change how many tasks write it)"
        )
    plan = BuildPlan(
        src, dataset_id, version, store, schema, progress, chunk_bytes, workers, engine
    )
    built: list[Manifest] = []

    def build(folder: str) -> Manifest:
        built.append(_build(folder, plan))
        return built[-1]

    dataref = store.get_or_build(
        dataset_id, version, build, overwrite=overwrite, on_transfer=on_transfer
    )
    if not built:  # an existing version: is it what this call would have cached?
        try:
            if schema is not None:
                check_schema(dataref, schema)
            warn_if_changed(dataref, src, compare_schema=schema is None)
        except BaseException:
            dataref.close()
            raise
    return dataref


def _checked_runner(engine: str, workers: int | None) -> int | None:
    """``workers``, checked with ``engine``."""
    if engine not in ENGINES:
        raise ValueError(f"engine must be one of {ENGINES}, got {engine!r}")
    return None if workers is None else check_int("workers", workers, 1)


def _build(folder: str, plan: BuildPlan) -> Manifest:
    """Write ``plan``'s source into the staging ``folder``: by Spark's tasks (a DataFrame), by
    parallel tasks, or serially; the manifest written there."""
    # The parallel runners are imported when a build takes them: the process pool's
    # machinery would add some 8 ms to every `import yogadl_plus`.
    if isinstance(plan.src, SparkDataFrameSource):
        from yogadl_plus.building.spark import build_on_spark

        return build_on_spark(folder, plan)
    if plan.parallel:
        from yogadl_plus.building.pool import build_in_parallel

        return build_in_parallel(folder, plan)
    return plan.write_serially(folder)
