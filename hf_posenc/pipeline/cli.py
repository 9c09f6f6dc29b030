"""How the command-line tools end on bad input: the error's message, naming the bad value, file or flag, on
one line and exit code 2, as argparse does for bad flags; no traceback. Other exceptions (bugs) keep theirs."""

import sys
from collections.abc import Callable
from pathlib import Path

USER_ERRORS = (ValueError, FileNotFoundError, NotADirectoryError, IsADirectoryError)


def run_cli(main: Callable[[], object]) -> None:
    """Run a tool's `main()`; a user error is printed as `<tool>: error: <message>` and exits with 2."""
    try:
        main()
    except USER_ERRORS as error:
        print(f"{Path(sys.argv[0]).name}: error: {error}", file=sys.stderr)
        sys.exit(2)
