"""The console commands, and how every command-line tool ends on bad input: the error's message, naming the bad
value, file or flag, on one line and exit code 2, as argparse does for bad flags; no traceback. A full disk and
Ctrl-C end in one line too (exit codes 2 and 130). Other exceptions (bugs) keep theirs. A module that an extra
installs and this install lacks is named with the extra to install. `check_number` is the range check the tools
apply to their numeric flags."""

import errno
import math
import os
import sys
from collections.abc import Callable
from importlib import import_module
from pathlib import Path

USER_ERRORS = (ValueError, FileNotFoundError, NotADirectoryError, IsADirectoryError)
# The top-level modules that only an extra of pyproject.toml installs, and that extra.
EXTRA_OF_MODULE = {
    "datasets": "train",
    "sacrebleu": "train",
    "accelerate": "train",
    "ctranslate2": "export",
    "matplotlib": "plots",
}


def run_cli(main: Callable[[], object], tool: str | None = None) -> None:
    """Run a tool's `main()`; a user error, or a full disk (`disk_full`), is printed as `<tool>: error: <message>`
    (`tool`: the program's name unless given) and exits with 2, an interrupt as `<tool>: interrupted[: <what it
    says>]` with 130."""
    tool = tool or Path(sys.argv[0]).name
    try:
        main()
    except USER_ERRORS as error:
        print(f"{tool}: error: {error}", file=sys.stderr)
        sys.exit(2)
    except KeyboardInterrupt as interrupt:  # Ctrl-C: one line, with what the tool says of its state
        print(f"{tool}: interrupted" + f": {interrupt}" * bool(str(interrupt)), file=sys.stderr)
        sys.exit(130)  # 128 + SIGINT, as a shell reports a process that SIGINT ended
    except ModuleNotFoundError as error:
        extra = EXTRA_OF_MODULE.get((error.name or "").partition(".")[0])
        if extra is None:
            raise
        print(
            f"{tool}: error: this needs {error.name}, which the extra [{extra}] installs: "
            f"pip install 'hf_posenc[{extra}]'",
            file=sys.stderr,
        )
        sys.exit(2)
    except Exception as error:
        if not disk_full(error):
            raise
        print(f"{tool}: error: a disk is full ({error}): free space and run it again", file=sys.stderr)
        sys.exit(2)


def disk_full(error: Exception) -> bool:
    """Whether `error` says that a disk is full: an OSError's number, or the text of the OS error that safetensors
    and others wrap in their own exception."""
    if isinstance(error, OSError) and error.errno in (errno.ENOSPC, errno.EDQUOT):
        return True
    return any(text in str(error) for text in (os.strerror(errno.ENOSPC), os.strerror(errno.EDQUOT)))


def command(target: str) -> Callable[[], None]:
    """A console command running `module:function`, imported only when the command runs, so that an extra
    missing from this install is named (`run_cli`) instead of failing the import of the entry point."""

    def run() -> None:
        module, _, name = target.partition(":")
        run_cli(lambda: getattr(import_module(module), name)())

    return run


train = command("hf_posenc.pipeline.training.run:main")  # hf-posenc-train: needs [train]
evaluate = command("hf_posenc.pipeline.evaluation.command:evaluate_main")  # hf-posenc-evaluate: needs [train]
average = command("hf_posenc.pipeline.training.averaging:average_main")  # hf-posenc-average: the base install
export = command("hf_posenc.pipeline.export.ctranslate2:main")  # hf-posenc-export: needs [export]


def check_number(
    name: str, value, minimum=None, maximum=None, *, integer: bool = False, hint: str = ""
) -> None:
    """Raise ValueError unless `value` is a finite number (a whole one with `integer`) in [minimum, maximum]
    (None: unbounded). The message names `name`, the value and the allowed range, e.g. "--batch_size=0 must be
    at least 1", "--length_penalty=nan must be a finite number"; `hint` follows it. For every numeric flag of
    the tools (NaN passes `<` and `>` comparisons, so a range check alone lets it through)."""
    if minimum is not None and maximum is not None:
        bounds = f"in [{minimum}, {maximum}]"
    elif minimum is not None or maximum is not None:
        bounds = f"at least {minimum}" if minimum is not None else f"at most {maximum}"
    else:
        bounds = ""
    kind = "a whole number" if integer else "a finite number"
    number = isinstance(value, int | float) and not isinstance(value, bool)
    if not number or not math.isfinite(value) or (integer and not isinstance(value, int)):
        problem = f"must be {kind}" + (f" {bounds}" if bounds else "")
    elif (minimum is not None and value < minimum) or (maximum is not None and value > maximum):
        problem = f"must be {bounds}"
    else:
        return
    shown = value if number else repr(value)
    raise ValueError(f"{name}={shown} {problem}" + (f"; {hint}" if hint else ""))
