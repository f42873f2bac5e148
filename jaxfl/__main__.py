"""``python -m jaxfl`` is the ``jaxfl`` command (for environments without the console script)."""
from jaxfl.cli import main

if __name__ == "__main__":
    main()
