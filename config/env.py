"""Read settings from the environment, failing at start-up with a message that says what to do.

Every reader names the variable and what it accepts, so a typo in a deployment
stops the process with one clear line instead of running with a silent default.
"""

from __future__ import annotations

import os
from collections.abc import Iterable

from django.core.exceptions import ImproperlyConfigured, ValidationError

from workshops.validators import validate_zone

TRUE_WORDS = frozenset({"1", "true", "yes", "on"})
FALSE_WORDS = frozenset({"0", "false", "no", "off", ""})


def _raw(name: str) -> str | None:
    value = os.environ.get(name)
    return None if value is None else value.strip()


def env_str(name: str, default: str = "") -> str:
    """Return the variable as text, or ``default`` when unset."""
    value = _raw(name)
    return default if value is None else value


def env_bool(name: str, default: bool = False) -> bool:
    """Return the variable as a boolean (1/0, true/false, yes/no, on/off)."""
    value = _raw(name)
    if value is None:
        return default
    lowered = value.lower()
    if lowered in TRUE_WORDS:
        return True
    if lowered in FALSE_WORDS:
        return False
    raise ImproperlyConfigured(
        f"{name} must be a boolean: one of 1/0, true/false, yes/no, on/off; got {value!r}."
    )


def env_int(name: str, default: int, *, minimum: int, maximum: int, unit: str = "") -> int:
    """Return the variable as a whole number within [minimum, maximum]."""
    value = _raw(name)
    if value is None or value == "":
        return default
    what = f"a whole number{f' of {unit}' if unit else ''} from {minimum} to {maximum}"
    try:
        number = int(value)
    except ValueError:
        raise ImproperlyConfigured(f"{name} must be {what}; got {value!r}.") from None
    if not minimum <= number <= maximum:
        raise ImproperlyConfigured(f"{name} must be {what}; got {number}.")
    return number


def env_float(
    name: str, default: float, *, minimum: float, maximum: float, unit: str = ""
) -> float:
    """Return the variable as a number within [minimum, maximum]."""
    value = _raw(name)
    if value is None or value == "":
        return default
    what = f"a number{f' of {unit}' if unit else ''} from {minimum:g} to {maximum:g}"
    try:
        number = float(value)
    except ValueError:
        raise ImproperlyConfigured(f"{name} must be {what}; got {value!r}.") from None
    if not minimum <= number <= maximum:
        raise ImproperlyConfigured(f"{name} must be {what}; got {number:g}.")
    return number


def env_choice(name: str, default: str, choices: Iterable[str]) -> str:
    """Return the variable if it is one of ``choices``."""
    options = tuple(choices)
    value = env_str(name, default).lower()
    if value not in options:
        raise ImproperlyConfigured(f"{name} must be one of {', '.join(options)}; got {value!r}.")
    return value


def env_list(name: str, default: Iterable[str] = ()) -> list[str]:
    """Return a comma-separated variable as a list of non-empty items."""
    value = _raw(name)
    if value is None:
        return list(default)
    return [item.strip() for item in value.split(",") if item.strip()]


def env_zone(name: str, default: str) -> str:
    """Return the variable if it is an IANA time zone name (the admin's check, and its words)."""
    value = env_str(name, default) or default
    try:
        validate_zone(value)
    except ValidationError as error:
        raise ImproperlyConfigured(f"{name}: {error.messages[0]}") from None
    return value
