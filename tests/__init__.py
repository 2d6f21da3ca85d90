"""datamask's tests, laid out like the package.

The tests of ``src/datamask/<pkg>/`` are in ``tests/<pkg>/`` (``tests/greedy/``,
``tests/io/``, ...); those of a top-level module ``src/datamask/<mod>.py`` are in
``tests/test_<mod>.py`` (``test_api.py``, ``test_neighbors.py``, ...), and
``tests/test_selectors.py`` runs the common battery over every registered method.
``tests/_data.py`` writes every parquet file the tests need; ``tests/conftest.py`` holds
the shared fixtures. Each folder is a package, so same-named files in two folders do not
clash and a test imports a helper as ``from tests._data import ...``.
"""
