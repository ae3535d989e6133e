"""``python -m treecoll``: the ``treecoll`` command line."""

import sys

from treecoll.tools.cli import main

sys.exit(main())
