"""What the tests share: real object-store servers (``servers``, also the pytest plugin of the
session's S3 and GCS servers), a counting and damaging proxy (``fault_proxy``), ways to find
and damage a cache on disk (``damage``), remote storages for a server spec (``remote_helpers``)
and the fixtures every test module may use (``fixtures``).

Imported as ``helpers.<module>``: pytest puts ``tests/`` on ``sys.path``.
"""
