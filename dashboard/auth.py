"""Who may see the dashboard: the login of a team's dashboard (issue 27).

A dashboard on loopback is the user's own; one listening on any other address is a
team's, and ``loopwatch dashboard`` refuses to start it without an auth mode
(:func:`check_auth`, exit 2):

- ``oidc``: Streamlit's own OpenID Connect login (``st.login`` / ``st.user``, Streamlit
  >= 1.42 with Authlib). The provider lives in Streamlit's ``secrets.toml`` (``[auth]``:
  ``redirect_uri``, ``cookie_secret``, ``client_id``, ``client_secret``,
  ``server_metadata_url``, or one ``[auth.NAME]`` section per provider), checked before
  start (:func:`check_oidc_secrets`: which keys are missing, never a value). Streamlit
  keeps the identity in a signed cookie.
- ``trusted-header``: behind a reverse proxy that authenticates and sets a header
  (``--auth-header``, e.g. ``X-Forwarded-User``); a session whose request lacks it is
  refused. The dashboard port must be reachable only from the proxy: anyone who can reach
  it directly can send the header themselves (docs/dashboard.md).

The Streamlit process learns the mode from its environment (``LOOPWATCH_DASHBOARD_AUTH``,
``_AUTH_HEADER``, ``_AUTH_PROVIDER``), set by :mod:`loopwatch.dashboard.cli`;
:func:`require_login` runs in the router (``app.py``) before any page, so no page renders
for an anonymous session.
"""

from __future__ import annotations

import os
import re
import tomllib
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any, Final

__all__ = [
    "AUTH_MODES",
    "LOOPBACK_HOSTS",
    "OIDC_KEYS",
    "AuthConfig",
    "check_auth",
    "check_oidc_secrets",
    "default_secrets_files",
    "require_login",
]

AUTH_MODES: Final = ("none", "oidc", "trusted-header")
"""The ``--auth`` choices; ``none`` only on loopback."""

LOOPBACK_HOSTS: Final = frozenset({"127.0.0.1", "::1", "localhost"})
"""Listen addresses that only this machine reaches (no login needed)."""

SHARED_KEYS: Final = ("redirect_uri", "cookie_secret")
"""``[auth]`` keys every provider shares (Streamlit's ``st.login`` docs)."""

OIDC_KEYS: Final = ("client_id", "client_secret", "server_metadata_url")
"""Keys of one OIDC provider, in ``[auth]`` or in an ``[auth.NAME]`` section."""

_HEADER_NAME: Final = re.compile(r"^[A-Za-z0-9!#$%&'*+.^_`|~-]{1,128}$")  # RFC 9110 token

ENV_AUTH: Final = "LOOPWATCH_DASHBOARD_AUTH"
ENV_HEADER: Final = "LOOPWATCH_DASHBOARD_AUTH_HEADER"
ENV_PROVIDER: Final = "LOOPWATCH_DASHBOARD_AUTH_PROVIDER"
ENV_KEYS: Final = (ENV_AUTH, ENV_HEADER, ENV_PROVIDER)


class AuthConfig:
    """The auth mode of one Streamlit process (from its environment).

    Attributes:
        mode: one of :data:`AUTH_MODES`.
        header: the trusted header's name (``trusted-header`` mode), else None.
        provider: the ``[auth.NAME]`` provider to log in with (``oidc``), None for the
            ``[auth]`` section's own.
    """

    __slots__ = ("header", "mode", "provider")

    def __init__(
        self, mode: str = "none", header: str | None = None, provider: str | None = None
    ) -> None:
        if mode not in AUTH_MODES:
            raise ValueError(f"auth mode must be one of {', '.join(AUTH_MODES)}, got {mode!r}")
        self.mode = mode
        self.header = header
        self.provider = provider

    @classmethod
    def from_env(cls, environ: Mapping[str, str]) -> AuthConfig:
        """Read :data:`ENV_KEYS`; unset means ``none``."""
        return cls(
            environ.get(ENV_AUTH) or "none",
            environ.get(ENV_HEADER) or None,
            environ.get(ENV_PROVIDER) or None,
        )

    def env(self) -> dict[str, str]:
        """The child's environment entries for this mode."""
        values = {ENV_AUTH: self.mode, ENV_HEADER: self.header, ENV_PROVIDER: self.provider}
        return {k: v for k, v in values.items() if v}


def default_secrets_files(cwd: Path | None = None) -> list[Path]:
    """Where Streamlit looks for ``secrets.toml`` by default: ``~/.streamlit/`` then the
    working directory's ``.streamlit/`` (the later one wins, key by key)."""
    return [
        Path.home() / ".streamlit" / "secrets.toml",
        (cwd or Path.cwd()) / ".streamlit" / "secrets.toml",
    ]


def check_oidc_secrets(files: Iterable[Path]) -> str | None:
    """Check that the ``secrets.toml`` files configure an OIDC login.

    Returns:
        the provider to pass to ``st.login`` (the one ``[auth.NAME]`` section), or None
        when ``[auth]`` itself holds the provider.

    Raises:
        ValueError: no file, no ``[auth]``, a missing shared key, no provider or several
            (naming the keys and files, never a value), or a file that is not TOML.
    """
    auth: dict[str, Any] = {}
    read: list[str] = []
    for path in files:
        if not path.is_file():
            continue
        try:
            document = tomllib.loads(path.read_text(encoding="utf-8"))
        except (OSError, UnicodeDecodeError, tomllib.TOMLDecodeError) as exc:
            raise ValueError(f"cannot read {path} as TOML: {type(exc).__name__}") from None
        section = document.get("auth")
        if isinstance(section, dict):
            auth.update(section)
        read.append(str(path))
    if not read:
        raise ValueError(
            "--auth oidc needs Streamlit's secrets.toml with an [auth] section "
            "(.streamlit/secrets.toml, or --secrets FILE); none found"
        )
    where = ", ".join(read)
    if not auth:
        raise ValueError(f"--auth oidc: no [auth] section in {where}")
    missing = [k for k in SHARED_KEYS if not auth.get(k)]
    if missing:
        raise ValueError(f"--auth oidc: [auth] lacks {', '.join(missing)} in {where}")
    if all(auth.get(k) for k in OIDC_KEYS):
        return None
    providers = [
        name
        for name, value in auth.items()
        if isinstance(value, dict) and all(value.get(k) for k in OIDC_KEYS)
    ]
    if len(providers) != 1:
        found = "none" if not providers else "several: " + ", ".join(sorted(providers))
        raise ValueError(
            f"--auth oidc: [auth] (or exactly one [auth.NAME]) must set "
            f"{', '.join(OIDC_KEYS)} in {where}; providers found: {found}"
        )
    return providers[0]


def check_auth(
    host: str,
    mode: str,
    *,
    header: str | None = None,
    secrets_files: Iterable[Path] | None = None,
) -> AuthConfig:
    """Validate the dashboard's auth options before it starts.

    Args:
        host: the listen address.
        mode: ``--auth`` (one of :data:`AUTH_MODES`).
        header: ``--auth-header`` (``trusted-header`` only).
        secrets_files: where ``secrets.toml`` is read (``oidc``); default
            :func:`default_secrets_files`.

    Raises:
        ValueError: off loopback without an auth mode; a header without the
            ``trusted-header`` mode or the reverse; a malformed header name; OIDC secrets
            missing (see :func:`check_oidc_secrets`). One line, meant for the terminal.
    """
    if mode not in AUTH_MODES:
        raise ValueError(f"--auth must be one of {', '.join(AUTH_MODES)}")
    if mode == "none" and host not in LOOPBACK_HOSTS:
        raise ValueError(
            f"--host {host} is reachable from other machines: give --auth oidc (Streamlit's "
            "login, provider in .streamlit/secrets.toml) or --auth trusted-header "
            "--auth-header NAME (behind an authenticating proxy); see docs/dashboard.md"
        )
    if mode == "trusted-header":
        if not header:
            raise ValueError("--auth trusted-header needs --auth-header NAME")
        if not _HEADER_NAME.fullmatch(header):
            raise ValueError(f"--auth-header must be an HTTP header name, got {header!r}")
        return AuthConfig(mode, header=header)
    if header:
        raise ValueError("--auth-header goes with --auth trusted-header")
    if mode == "oidc":
        files = default_secrets_files() if secrets_files is None else list(secrets_files)
        return AuthConfig(mode, provider=check_oidc_secrets(files))
    return AuthConfig(mode)


def require_login(environ: Mapping[str, str] | None = None) -> str | None:
    """Gate the app: return the signed-in user's name, or stop the script run.

    ``none``: returns None (a loopback dashboard). ``oidc``: an anonymous session sees a
    login button only; a signed-in one gets a sign-out button in the sidebar.
    ``trusted-header``: a session whose request lacks the header sees an error only.
    Called by the router before ``st.navigation``, so no page runs for a refused session.
    """
    import streamlit as st

    from .ui import escape_md

    config = AuthConfig.from_env(os.environ if environ is None else environ)
    if config.mode == "none":
        return None
    if config.mode == "trusted-header":
        assert config.header is not None  # checked at start (check_auth)
        user = (st.context.headers.get(config.header) or "").strip()
        if not user:
            st.set_page_config(page_title="loopwatch", layout="wide")
            st.error(
                f"Refused: this dashboard is served behind an authenticating proxy, and the "
                f"request carried no {escape_md(config.header)} header. Open it through "
                "the proxy's address."
            )
            st.stop()
        st.sidebar.caption(f"Signed in as {escape_md(user)}")
        return user
    if not st.user.is_logged_in:
        st.set_page_config(page_title="loopwatch", layout="wide")
        st.title("loopwatch")
        st.info("Sign in to see this team's agent runs.")
        provider = config.provider
        st.button(
            "Log in",
            on_click=st.login,
            args=() if provider is None else (provider,),
            type="primary",
        )
        st.stop()
    name = str(st.user.get("email") or st.user.get("name") or "signed in")
    st.sidebar.caption(f"Signed in as {escape_md(name)}")
    st.sidebar.button("Log out", on_click=st.logout)
    return name
