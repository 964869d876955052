"""``python -m datagen SUBCOMMAND --config datagen.yml``."""

from __future__ import annotations

import sys

from datagen.cli import main

if __name__ == "__main__":
    sys.exit(main())
