"""The collection's tests, as a package: ``from tests.support import ...`` works from pytest and ``python -m``.

Importing the package puts the collection and the lab's helper directories on
``sys.path`` (tests/support/paths.py, the one place that does), so a test, a
benchmark (``python -m tests.bench.bench_NAME``) or a support module can import
``ansible_collections.gpuops.repurpose``, ``datagen`` and the lab's helpers in any order.
"""

from tests.support.paths import add_import_dirs

add_import_dirs()
