"""manage.py revoke_api_token PREFIX: revoke the API token starting with PREFIX (or that token)."""

from django.core.management.base import BaseCommand, CommandError
from django.db.models import Q

from intake.models import ApiToken
from intake.tokens import digest_of, token_revoke


class Command(BaseCommand):
    help = "Revoke an API token, named by the prefix the admin and create_api_token show."

    def add_arguments(self, parser) -> None:
        parser.add_argument(
            "prefix", help="The token's first characters, e.g. wr_Ab12Cd, or the whole token."
        )

    def handle(self, *args, prefix: str, **options) -> None:
        prefix = prefix.strip().rstrip("…")
        # The prefix the admin shows, or the whole token (a leaked one, pasted as it is).
        named = Q(prefix=prefix) | Q(digest=digest_of(prefix))
        found = list(ApiToken.objects.filter(named).select_related("integration"))
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
