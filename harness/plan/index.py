"""Where packages come from, and the version words that float: configuration shared by the matrix
(which names `latest`), the environments (which install) and the version lookup (which asks the index).
It imports no other harness module but harness.environment (the variables' names), so none of those three has to
import another for it.

  HARNESS_INDEX_URL        replaces the default index (e.g. a CUDA torch index or a mirror)
  HARNESS_EXTRA_INDEX_URL  more indexes, space-separated
  HARNESS_FIND_LINKS       folders or pages of wheels, space-separated (default: $PIP_FIND_LINKS)
  HARNESS_INSTALLER_ARGS   anything else for the installer (shell-quoted)
"""

from __future__ import annotations

import os
import re
import shlex

from harness.environment import EXTRA_INDEX_URL_ENV, FIND_LINKS_ENV, INDEX_URL_ENV, INSTALLER_ARGS_ENV

# A version that floats: the newest release on the index, or the one N releases before it.
FLOATING = re.compile(r"latest(?:-([0-9]+))?")
# Variables that change what the index answers; part of a lookup's cache key so tests and runs never mix.
INDEX_VARIABLES = (
    INDEX_URL_ENV,
    EXTRA_INDEX_URL_ENV,
    FIND_LINKS_ENV,
    "PIP_INDEX_URL",
    "PIP_EXTRA_INDEX_URL",
    "PIP_FIND_LINKS",
    "PIP_NO_INDEX",
)


def index_arguments(installer: str, *, installer_args: bool = True) -> list[str]:
    """Where packages come from, as the installer's options; `installer_args` adds HARNESS_INSTALLER_ARGS
    (left out where another command asks the same index, e.g. `pip index versions`)."""
    arguments = []
    if os.environ.get(INDEX_URL_ENV):
        arguments += ["--index-url", os.environ[INDEX_URL_ENV]]
    for url in os.environ.get(EXTRA_INDEX_URL_ENV, "").split():
        arguments += ["--extra-index-url", url]
    # pip already reads PIP_FIND_LINKS; uv does not, so hand it over explicitly.
    find_links = os.environ.get(FIND_LINKS_ENV) or (
        os.environ.get("PIP_FIND_LINKS", "") if installer == "uv" else "")
    for location in find_links.split():
        arguments += ["--find-links", location]
    if installer == "uv" and len(arguments) > 2:
        # A CUDA torch index and PyPI both carry torch; take the best match, not the first index.
        arguments += ["--index-strategy", "unsafe-best-match"]
    return arguments + (shlex.split(os.environ.get(INSTALLER_ARGS_ENV, "")) if installer_args else [])
