"""``python -m lib.sweep``: see lib/sweep/__init__.py.

Ray ships the sweep's functions by their module's name; they live in lib.sweep's modules, never
in ``__main__``, so a Ray worker can import them.
"""

import sys

from lib.sweep import main

sys.exit(main())
