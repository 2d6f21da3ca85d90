"""``python -m datamask.cli``: the ``datamask`` command."""

import sys

from .main import main

sys.exit(main())
