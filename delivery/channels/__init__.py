"""Ways of handing a message to a provider."""

from delivery.channels.file import FileChannel
from delivery.channels.http import HttpChannel, HttpSettings
from delivery.channels.smtp import SmtpChannel, SmtpSettings
from delivery.channels.threaded import ThreadedChannel

__all__ = [
    "FileChannel",
    "HttpChannel",
    "HttpSettings",
    "SmtpChannel",
    "SmtpSettings",
    "ThreadedChannel",
]
