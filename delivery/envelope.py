"""The immutable input of a delivery: one message for one recipient.

Programming errors raise at construction; bad data (a malformed recipient) becomes a
``PERMANENT`` result, so one bad row never stops the rest of a batch.
"""

from __future__ import annotations

import re
import unicodedata
from collections.abc import Iterable, Iterator, Mapping
from dataclasses import dataclass, field
from datetime import UTC, datetime

__all__ = ["Attachment", "Envelope", "FrozenMap"]

MAX_KEY_LENGTH = 255
_CONTENT_TYPE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9!#$&^_.+-]*/[A-Za-z0-9][A-Za-z0-9!#$&^_.+-]*$")


def _has_control(text: str) -> bool:
    return any(unicodedata.category(ch) == "Cc" for ch in text)


class FrozenMap(Mapping[str, str]):
    """An immutable, hashable, picklable ``str -> str`` mapping."""

    __slots__ = ("_data",)

    def __init__(self, data: Mapping[str, str] | Iterable[tuple[str, str]] = (), /) -> None:
        items = dict(data)
        for name, value in items.items():
            if not isinstance(name, str) or not isinstance(value, str):
                raise TypeError(
                    f"payload keys and values must be str (got {name!r}: {value!r}); "
                    "convert numbers and dates to text (e.g. isoformat()) before building "
                    "the envelope."
                )
        self._data = items

    def __getitem__(self, name: str) -> str:
        return self._data[name]

    def __iter__(self) -> Iterator[str]:
        return iter(self._data)

    def __len__(self) -> int:
        return len(self._data)

    def __hash__(self) -> int:
        return hash(frozenset(self._data.items()))

    def __repr__(self) -> str:
        return f"FrozenMap({self._data!r})"


@dataclass(frozen=True, slots=True, kw_only=True)
class Attachment:
    """A file sent with the message (e.g. an ``.ics`` invitation)."""

    filename: str
    content_type: str
    content: bytes

    def __post_init__(self) -> None:
        if (
            not self.filename
            or _has_control(self.filename)
            or any(c in self.filename for c in "/\\")
        ):
            raise ValueError(
                f"Attachment filename {self.filename!r} must be a non-empty base name without "
                "path separators or control characters."
            )
        if not _CONTENT_TYPE.match(self.content_type):
            raise ValueError(
                f"Attachment content_type {self.content_type!r} must look like 'type/subtype', "
                "e.g. 'text/calendar'."
            )


@dataclass(frozen=True, slots=True, kw_only=True)
class Envelope:
    """One message to deliver.

    ``send_by`` is the deadline on the sending host's clock, kept out of the content so a
    retry on another host sends the same bytes. Mail channels drop an unusable ``reply_to``.
    """

    reminder_id: int
    key: str
    recipient: str
    recipient_name: str
    subject: str
    text_body: str
    deadline_at: datetime
    html_body: str | None = None
    attachments: tuple[Attachment, ...] = ()
    payload: Mapping[str, str] = field(default_factory=FrozenMap)
    reply_to: str = ""
    reply_to_name: str = ""
    list_id: str = ""
    send_by: datetime | None = None
    #: iTIP method (PUBLISH, CANCEL) of the text/calendar attachment; mail channels also carry
    #: it inline (``method=...``, RFC 6047) for clients to offer as an update. Blank: attached only.
    calendar_method: str = ""
    #: RFC 8058 one-click unsubscribe URL: mail channels add List-Unsubscribe(-Post). Blank: none.
    unsubscribe_url: str = ""
    #: What the message is, for the observer's series: "reminder" or "notice" (a change notice).
    kind: str = "reminder"

    @property
    def stop_at(self) -> datetime:
        """Return the instant from which no call may start."""
        return self.send_by or self.deadline_at

    def __post_init__(self) -> None:
        if not isinstance(self.key, str) or not self.key:
            raise ValueError("Envelope.key is empty; pass the reminder's stable idempotency key.")
        if len(self.key) > MAX_KEY_LENGTH or _has_control(self.key) or not self.key.isascii():
            raise ValueError(
                f"Envelope.key {self.key!r} must be at most {MAX_KEY_LENGTH} printable ASCII "
                "characters (it is sent as an HTTP header); hash longer keys."
            )
        if self.unsubscribe_url and (
            not self.unsubscribe_url.startswith(("https://", "http://"))
            or not self.unsubscribe_url.isprintable()
            or any(c in self.unsubscribe_url for c in " <>")
        ):
            raise ValueError(
                f"Envelope.unsubscribe_url {self.unsubscribe_url!r} must be one http(s) URL "
                "without spaces or angle brackets."
            )
        # astimezone() would read a naive time as this host's local time, silently.
        for name in ("deadline_at", "send_by"):
            moment = getattr(self, name)
            if moment is not None and moment.utcoffset() is None:
                raise ValueError(
                    f"Envelope.{name} is naive; pass an aware datetime (e.g. tzinfo=UTC)."
                )
            if moment is not None:
                object.__setattr__(self, name, moment.astimezone(UTC))
        object.__setattr__(self, "attachments", tuple(self.attachments))
        if not isinstance(self.payload, FrozenMap):
            object.__setattr__(self, "payload", FrozenMap(self.payload))
