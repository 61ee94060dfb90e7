"""Key suppressions and reports by one spelling of each address: its domain in Unicode as
IDNA (UTS 46) maps it, so a punycode or decomposed domain is the mailbox it names.

Only addresses with a non-ASCII or punycode domain change key. A suppression whose address
an erasure blanked cannot be keyed again: it stays under the key of the spelling it had.
"""

import idna
from django.db import migrations
from django.utils.crypto import salted_hmac

# A domain not plain ASCII, or one in punycode.
_RESPELT = r"[^\x01-\x7f]|xn--"


def _key(text: str) -> str:
    return salted_hmac("reminders.suppression", text, algorithm="sha256").hexdigest()


def _one_spelling(email: str) -> str:
    """As reminders.services.feedback._one_spelling when this migration was written."""
    local, at, domain = email.strip().lower().rpartition("@")
    if at and (not domain.isascii() or "xn--" in domain):
        try:
            domain = idna.decode(idna.encode(domain, uts46=True))
        except UnicodeError:
            pass
    return f"{local}{at}{domain}"


def key_again(apps, schema_editor):
    Suppression = apps.get_model("reminders", "Suppression")
    DeliveryEvent = apps.get_model("reminders", "DeliveryEvent")
    addresses = set()
    for model, field in (
        (Suppression, "address"),
        (apps.get_model("reminders", "Reminder"), "sent_to"),
        (apps.get_model("reminders", "Notice"), "sent_to"),
        (apps.get_model("workshops", "Attendee"), "email"),
    ):
        rows = model.objects.filter(**{f"{field}__iregex": _RESPELT}).order_by()
        addresses.update(rows.values_list(field, flat=True).distinct())
    moved = {}
    for address in addresses:
        old, new = _key(address.strip().lower()), _key(_one_spelling(address))
        if old != new:
            moved[old] = new
    for old, new in moved.items():
        DeliveryEvent.objects.filter(address_key=old).update(address_key=new)
        for row in Suppression.objects.filter(address_key=old).order_by("created_at", "pk"):
            live = Suppression.objects.filter(address_key=new, lifted_at__isnull=True)
            if row.lifted_at is None and live.exists():
                continue  # suppressed under its key already: this row stays as it was
            Suppression.objects.filter(pk=row.pk).update(address_key=new)


class Migration(migrations.Migration):
    dependencies = [
        ("reminders", "0034_notice_claimed_while_sending"),
    ]

    operations = [migrations.RunPython(key_again, migrations.RunPython.noop)]
