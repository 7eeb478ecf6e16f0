"""What `npudist launch` refuses with: one error whose message says what to change."""

from __future__ import annotations

from collections.abc import Mapping

from npudist.runtime.settings import Settings, SettingsError


class LaunchError(RuntimeError):
    """The launch command cannot start as asked; the message says what to change."""


def settings(env: Mapping[str, str]) -> Settings:
    try:
        return Settings.from_env(env)
    except SettingsError as exc:
        raise LaunchError(str(exc)) from None
