"""Scripts the tests run as subprocesses (``python tests/jobs/<name>.py ARGS``): a DDP rank,
a Keras training job killed and run again, a Keras job on another backend, a Ray stream dropped
on Ray's own thread. Each says its arguments in its docstring.

A test that needs a job's constants imports it as ``jobs.<name>``.
"""
