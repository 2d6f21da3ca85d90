"""The ``datamask`` command line: one module per command (``select``, ``evaluate``,
``report``, ``bench``, ``apply``, ``embed``), flags made from the library's settings
(:mod:`datamask.settings`); :mod:`.docs` writes their flag tables in docs/cli.md. The
library never imports argparse; only this package does.
"""

from .main import EXIT_BAD_INPUT, EXIT_IO_ERROR, build_parser, main

__all__ = ["EXIT_BAD_INPUT", "EXIT_IO_ERROR", "build_parser", "main"]
