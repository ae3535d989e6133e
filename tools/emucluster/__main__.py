"""``python -m treecoll.tools.emucluster up|down|run|status|measure`` (same as ``treecoll emu``)."""

import sys

from .cli import main

sys.exit(main())
