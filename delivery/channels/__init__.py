"""Ways of handing a message to a provider.

``HttpChannel`` and ``FileChannel`` honour idempotency keys; ``SmtpChannel``
and ``ThreadedChannel`` do not.
"""

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
