"""Channels: ways of handing a message to a provider.

| channel          | honours idempotency keys | notes                                          |
|------------------|--------------------------|------------------------------------------------|
| ``SmtpChannel``  | no                       | pooled aiosmtplib connections; never hedged    |
| ``HttpChannel``  | yes                      | signed JSON, ``Idempotency-Key``; may hedge    |
| ``ThreadedChannel`` | as declared           | runs a blocking callable in a thread per call  |
| ``FileChannel``  | yes                      | one ``.eml`` per key, written atomically       |
| ``MemoryChannel``| as declared              | scriptable test double                         |
"""

from delivery.channels.file import FileChannel
from delivery.channels.http import HttpChannel, HttpSettings
from delivery.channels.memory import MemoryCall, MemoryChannel
from delivery.channels.smtp import SmtpChannel, SmtpSettings
from delivery.channels.threaded import ThreadedChannel

__all__ = [
    "FileChannel",
    "HttpChannel",
    "HttpSettings",
    "MemoryCall",
    "MemoryChannel",
    "SmtpChannel",
    "SmtpSettings",
    "ThreadedChannel",
]
