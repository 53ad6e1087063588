"""yogadl 0.1.4 tf.data baseline of bench_frameworks and bench_tf_records, run in the yogadl
side venv (from the repository root):

    .baselines/yogadl/bin/python -m bench.baselines.yogadl_tf --x X.npy --label L.npy \
        --workdir DIR [--repeats 3] [--records-repeats 5] [--no-reduce]

Caches the arrays with yogadl's own build (``LFSStorage.cacheable`` over
``tf.data.Dataset.from_tensor_slices({"x": x, "label": label})``, not timed), then times full
shuffled epochs of yogadl's tf.data path: ``yogadl.tensorflow.make_tf_dataset(
dataref.stream(shuffle=True, shuffle_seed=0))`` (a ``tf.data.Dataset.from_generator`` over the
stream's Python generator, ``txn.get`` + ``pickle.loads`` per record), iterated in Python
(``for _ in ds: pass``, eager), and, unless ``--no-reduce``, with ``ds.reduce`` (tf.data's own
loop, no eager step per element). A run includes making the stream and the dataset. Each figure
is the best (minimum time) of ``--repeats`` runs (``--records-repeats`` for the eager loop).
Prints one JSON object on the last line of stdout.
"""

from __future__ import annotations

import json
import os
import sys

from bench.baselines.yogadl_cache import yogadl_cache
from bench.harness import arrays_parser, time_once, timed, warm

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")


def main() -> None:
    parser = arrays_parser(__doc__.split("\n\n")[0], "x", "label")
    parser.add_argument(
        "--records-repeats",
        type=int,
        default=None,
        help="runs of the eager loop (default --repeats)",
    )
    parser.add_argument("--no-reduce", action="store_true", help="skip the ds.reduce timings")
    args = parser.parse_args()

    import numpy as np
    import tensorflow as tf
    import yogadl
    import yogadl.tensorflow as ytf

    _, make, x, label = yogadl_cache(args.x, args.label, args.workdir, "bench_tf")
    n = len(label)

    build_s, dataref = time_once(make)
    assert len(dataref) == n, (len(dataref), n)
    cache_file = os.path.join(args.workdir, "bench_tf", "v1", "cache.mdb")
    warm(cache_file)

    # Untimed check: the tf dataset yields the same records (one of them), with the dtypes.
    first = next(iter(ytf.make_tf_dataset(dataref.stream())))
    assert np.array_equal(first["x"].numpy(), x[0]) and int(first["label"]) == int(label[0])
    assert first["x"].dtype == tf.float32 and first["label"].dtype == tf.int64

    def eager() -> None:
        count = 0
        for _record in ytf.make_tf_dataset(dataref.stream(shuffle=True, shuffle_seed=0)):
            count += 1  # eager Python iteration, as on the yogadl_plus side
        assert count == n, (count, n)

    def graph() -> None:
        ds = ytf.make_tf_dataset(dataref.stream(shuffle=True, shuffle_seed=0))
        count = int(ds.reduce(np.int64(0), lambda c, _: c + 1))  # tf.data's own loop
        assert count == n, (count, n)

    times = timed(eager, args.records_repeats or args.repeats)
    reduce_times = timed(graph, 0 if args.no_reduce else args.repeats)

    print(
        json.dumps(
            {
                "yogadl_version": getattr(yogadl, "__version__", "0.1.4"),
                "tensorflow_version": tf.__version__,
                "n": n,
                "build_s": build_s,
                "build_method": "LFSStorage.cacheable(tf.data.Dataset.from_tensor_slices)",
                "times_s": times,
                "best_s": min(times),
                "iteration": "for _ in make_tf_dataset(stream): (eager)",
                "reduce_times_s": reduce_times,
                "reduce_best_s": min(reduce_times) if reduce_times else None,
                "reduce_iteration": "make_tf_dataset(stream).reduce(0, lambda c, _: c + 1)",
                "python": sys.version.split()[0],
            }
        )
    )


if __name__ == "__main__":
    main()
