"""The consoles every command writes to: messages on stderr, tables on stdout."""
from __future__ import annotations

import sys

from rich.console import Console

err_console = Console(stderr=True)
# tables stay readable when piped (rich would wrap them at 80 columns)
out_console = Console(width=None if sys.stdout.isatty() else 160)
