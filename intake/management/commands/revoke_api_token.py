"""manage.py revoke_api_token PREFIX: revoke the API token starting with PREFIX."""

from django.core.management.base import BaseCommand, CommandError

from intake.models import ApiToken
from intake.tokens import token_revoke


class Command(BaseCommand):
    help = "Revoke an API token, named by the prefix the admin and create_api_token show."

    def add_arguments(self, parser) -> None:
        parser.add_argument("prefix", help="The token's first characters, e.g. wr_Ab12Cd.")

    def handle(self, *args, prefix: str, **options) -> None:
        prefix = prefix.rstrip("…")
        found = list(ApiToken.objects.filter(prefix=prefix).select_related("integration"))
        if not found:
            raise CommandError(f"No API token starts with {prefix!r}; the admin lists them.")
        if len(found) > 1:
            raise CommandError(
                f"{len(found)} tokens start with {prefix!r}; revoke the one you mean in the admin."
            )
        if token_revoke(token=found[0], revoked_by="manage.py revoke_api_token"):
            self.stdout.write(f"Revoked {found[0]}.")
        else:
            self.stdout.write(f"{found[0]} was already revoked.")
