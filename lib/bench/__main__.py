"""``python -m lib.bench``: see lib/bench/__init__.py."""

from lib.bench.command import main

main()
