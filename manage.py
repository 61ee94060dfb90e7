#!/usr/bin/env python
"""Django's command-line utility for administrative tasks."""

import os
import secrets
import sys

KEYLESS_COMMANDS = frozenset(
    {"makemigrations", "showmigrations", "makemessages", "compilemessages"}
)


def main() -> None:
    """Run administrative tasks."""
    os.environ.setdefault("DJANGO_SETTINGS_MODULE", "config.settings")
    if len(sys.argv) > 1 and sys.argv[1] in KEYLESS_COMMANDS:
        # These only compare models with migration files or read and write translation
        # files; nothing is signed, so they need no real SECRET_KEY (every other command
        # still does).
        os.environ.setdefault("SECRET_KEY", secrets.token_urlsafe(32))
    from django.core.management import execute_from_command_line

    execute_from_command_line(sys.argv)


if __name__ == "__main__":
    main()
