"""One exception type per exit code. `cli.main` catches `FatalError`, prints one
line (``::error::`` under GitHub Actions) and exits with the error's code.

`harness run`'s own exit statuses (a red cell, a cell that ran nothing distributed, a signal) are here too:
`run_exit_statuses` lists every one for its --help."""

from __future__ import annotations

# harness run, beside the FatalErrors' codes: a cell failed or errored; no cell did, but one ran nothing
# distributed (status not_run: not green, told apart from 1 and from the FatalErrors' 2-5); stopped by a signal
# (SIGINT or SIGTERM from outside the cell), EXIT_SIGNAL + its number.
EXIT_RED = 1
EXIT_NOT_RUN = 6
EXIT_SIGNAL = 128


class FatalError(Exception):
    """Stops the command; `return_code` is the process exit status."""

    return_code = 1


class ConfigError(FatalError):
    """Bad input: a matrix file, a key, a value or an argument; the message names what is wrong."""

    return_code = 2


class HostMismatchError(FatalError):
    """A selected cell cannot run on this machine (GPU type or count) and --force was not given."""

    return_code = 3


class GitHubError(FatalError):
    """The GitHub API answered with an error, or could not be reached."""

    return_code = 4


class NotAuthorizedError(FatalError):
    """`harness gh authorize` refused the request; the message is the reason posted back."""

    return_code = 5


def run_exit_statuses() -> list[tuple[str, str]]:
    """`harness run`'s exit statuses and what each means, in order (its --help's epilog): the FatalErrors it
    can end with say what they are in their docstrings."""
    def meaning(error: type[FatalError]) -> str:  # the docstring, as a line of the epilog
        text = " ".join((error.__doc__ or error.__name__).split()).rstrip(".")
        return text[:1].lower() + text[1:]

    return [
        ("0", "every cell passed"),
        (str(EXIT_RED), "a cell failed or errored"),
        *((str(error.return_code), meaning(error)) for error in (ConfigError, HostMismatchError)),
        (str(EXIT_NOT_RUN), "no cell failed or errored, but one ran nothing distributed (not run: every case on 2 "
                            "or more GPUs or ranks skipped for too few)"),
        (f"{EXIT_SIGNAL}+N", "stopped by signal N from outside the cell: 130 SIGINT (Ctrl-C), 143 SIGTERM"),
    ]
