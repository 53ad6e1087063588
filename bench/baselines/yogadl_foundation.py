"""yogadl 0.1.4 baseline of bench_foundation, run in the yogadl side venv (from the repository
root):

    .baselines/yogadl/bin/python -m bench.baselines.yogadl_foundation --x X.npy --label L.npy \
        --workdir DIR [--repeats 3]

Builds yogadl's LMDB cache (``LFSStorage.cacheable`` over ``tf.data.Dataset.from_tensor_slices``
of the same arrays), then times full epochs of yogadl's *own* shuffled stream iterator: the
Python generator ``LMDBDataRef.stream(shuffle=True, shuffle_seed=0)`` returns from ``iter()``
(``Stream.iterator_fn``), which reads each record with ``txn.get`` + ``pickle.loads``. No
tf.data pipeline is involved in the reads. Prints one JSON object on the last line of stdout.
"""

from __future__ import annotations

import json
import os
import sys

from bench.baselines.yogadl_cache import yogadl_cache
from bench.harness import arrays_parser, best_of, time_once, warm

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")


def main() -> None:
    parser = arrays_parser(__doc__.split("\n\n")[0], "x", "label")
    parser.add_argument(
        "--timed-build-max",
        type=int,
        default=100_000,
        help="above this N, skip the (slow, ~65 us/record) tf.data iteration of the build and "
        "write the cache with yogadl's own serializer from numpy instead",
    )
    args = parser.parse_args()

    import numpy as np
    import tensorflow as tf
    import yogadl

    lfs, make, x, label = yogadl_cache(args.x, args.label, args.workdir, "bench")
    n = len(label)

    if n <= args.timed_build_max:
        # The real thing: cacheable -> LFSStorage.submit -> tf.data iteration -> pickle -> LMDB.
        build_method = "LFSStorage.cacheable(tf.data.Dataset.from_tensor_slices)"
        build_s, dataref = time_once(make)  # one build (it is slow), not best of N
    else:
        # Same file, same writer (yogadl.serialize_generator_to_lmdb, what submit() calls), fed
        # from numpy instead of iterating tf.data, which alone would take over a minute at 1M.
        build_method = "yogadl.serialize_generator_to_lmdb(numpy rows), then LFSStorage.fetch"
        dataset = tf.data.Dataset.from_tensor_slices({"x": x[:1], "label": label[:1]})
        path = lfs._get_cache_filepath("bench", "v1")
        path.parent.mkdir(parents=True, exist_ok=True)
        build_s, _ = time_once(
            lambda: yogadl.serialize_generator_to_lmdb(
                ({"x": x[i], "label": label[i]} for i in range(n)),
                tf.compat.v1.data.get_output_shapes(dataset),
                tf.compat.v1.data.get_output_types(dataset),
                path,
            )
        )
        dataref = lfs.fetch("bench", "v1")
    assert len(dataref) == n, (len(dataref), n)
    cache_file = os.path.join(args.workdir, "bench", "v1", "cache.mdb")
    warm(cache_file)

    # Check that a record holds the same data as ours.
    first = next(iter(dataref.stream()))
    assert np.array_equal(first["x"], x[0]) and int(first["label"]) == int(label[0])

    def epoch() -> None:
        count = 0
        for _record in dataref.stream(shuffle=True, shuffle_seed=0):
            count += 1  # Stream.__iter__ -> iterator_fn(): yogadl's own generator
        assert count == n, (count, n)

    _, times = best_of(epoch, args.repeats)  # the same rule as the yogadl_plus rows

    print(
        json.dumps(
            {
                "yogadl_version": getattr(yogadl, "__version__", "0.1.4"),
                "tensorflow_version": tf.__version__,
                "n": n,
                "build_s": build_s,
                "build_repeats": 1,
                "build_method": build_method,
                "shuffled_times_s": times,
                "cache_bytes": os.path.getsize(cache_file),
                "python": sys.version.split()[0],
            }
        )
    )


if __name__ == "__main__":
    main()
