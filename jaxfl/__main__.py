"""``python -m jaxfl`` is the ``jaxfl`` command (for environments without the console script)."""
import sys

from jaxfl.cli import main

if __name__ == "__main__":
    sys.exit(main())  # the command's status, as the console script gives it
