"""One exception type per exit code. `cli.main` catches `FatalError`, prints one
line (``::error::`` under GitHub Actions) and exits with the error's code."""

from __future__ import annotations


class FatalError(Exception):
    """Stops the command; `return_code` is the process exit status."""

    return_code = 1


class ConfigError(FatalError):
    """Bad input: a matrix file, a key, a value or an argument. Names what is wrong."""

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
