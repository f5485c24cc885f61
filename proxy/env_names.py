"""The environment's ``KVPROXY_*`` variables checked against the settings they may name: pydantic-settings
ignores a variable that names no field (``extra="ignore"``), so a misspelt one would change nothing
without a word; each gets one warning instead, naming the setting it probably meant."""

from __future__ import annotations

import difflib
import functools
import logging
from collections.abc import Iterable, Mapping

log = logging.getLogger(__name__)

PREFIX = "KVPROXY_"
READ_ELSEWHERE = frozenset(
    {"KVPROXY_API_KEY", "KVPROXY_TEST_REDIS_URL", "KVPROXY_TEST_REDIS_SERVER", "KVPROXY_AGENTS_NPM_PREFIX"}
)
"""``KVPROXY_*`` variables that name no setting but are read on purpose: ``kvproxy cache``'s
``--api-key``, the tests' Redis (``tests/conftest.py``) and where the agents check finds
the agents (``tests/e2e/test_real_agents.py``)."""
CLIENT_KEY = "KVPROXY_API_KEY"
"""The key ``kvproxy cache`` sends: set for a server, it is a server left open by mistake for
``KVPROXY_API_KEYS`` (the keys a server requires), unless those are set too."""


def unknown_variables(
    command: str,
    fields: Iterable[str],
    environ: Mapping[str, str],
    given: Mapping[str, object] | None = None,
    *,
    serves: bool = True,
) -> list[str]:
    """One warning per ``KVPROXY_*`` variable of ``environ`` that names none of ``fields`` (the
    settings of ``command``), naming the setting it probably meant where one is close; and one for
    ``CLIENT_KEY`` where ``command`` ``serves`` behind ``api_keys`` but neither ``given`` (the
    settings passed as flags) nor ``environ`` sets any."""
    known = {name.upper() for name in fields}
    upper = {variable.upper(): value for variable, value in environ.items()}
    warnings = []
    keys = (given or {}).get("api_keys") or upper.get(f"{PREFIX}API_KEYS")
    if CLIENT_KEY in upper and serves and "API_KEYS" in known and not str(keys or "").strip():
        warnings.append(
            f"{CLIENT_KEY} is the key kvproxy cache sends, not a setting of {command}: no key is required "
            f"here; to require keys, set {PREFIX}API_KEYS (--api-keys)"
        )
    for variable in sorted(environ):
        # NOTE: pydantic-settings reads the names case-insensitively, so they are compared so too
        name = variable.upper().removeprefix(PREFIX)
        if not variable.upper().startswith(PREFIX) or name in known or variable.upper() in READ_ELSEWHERE:
            continue
        close = difflib.get_close_matches(name, known, n=1, cutoff=0.75)
        meant = f" (did you mean {PREFIX}{close[0]}?)" if close else ""
        warnings.append(f"{variable} is not a setting of {command}: ignored{meant}")
    return warnings


@functools.cache
def warn_once(message: str) -> None:
    """Log ``message`` once per process, however many times the settings are read."""
    log.warning("%s", message)
