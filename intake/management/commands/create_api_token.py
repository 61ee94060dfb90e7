"""manage.py create_api_token NAME [--scope SCOPE ...] [--label LABEL]: a token for integration NAME.

The token is printed alone on the last line, once: only its digest is stored.
"""

from django.core.management.base import BaseCommand, CommandError

from intake.tokens import SCOPES, token_create


class Command(BaseCommand):
    help = "Create an API token for an integration (created if new); print it once."

    def add_arguments(self, parser) -> None:
        parser.add_argument("name", help="The integration, e.g. 'shop'.")
        parser.add_argument(
            "--scope",
            action="append",
            choices=SCOPES,
            dest="scopes",
            help=f"What the token may do (repeat for more): {', '.join(SCOPES)}. "
            "Default: read and enrolments.",
        )
        parser.add_argument("--label", default="default", help="What this token is for.")

    def handle(self, *args, name: str, scopes, label: str, **options) -> None:
        try:
            made = token_create(
                integration=name,
                name=label,
                scopes=scopes or ["read", "enrolments"],
                created_by="manage.py create_api_token",
            )
        except ValueError as error:
            raise CommandError(str(error)) from None
        token = made.token
        self.stderr.write(
            f"Token {token.prefix}… for {token.integration.name} ({token.name}), scopes: "
            f"{', '.join(token.scopes)}. It is shown once; revoke it in the admin or with "
            f"manage.py revoke_api_token {token.prefix}."
        )
        self.stdout.write(made.secret)
