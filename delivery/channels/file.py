"""Write each message as an ``.eml`` file, for development and demos.

The file name derives from the key, so a re-send replaces the file; files
are written atomically, so a reader never sees half a message.
"""

from __future__ import annotations

import asyncio
import os
import tempfile
from pathlib import Path
from typing import Self

from clock import Clock
from delivery.envelope import Envelope
from delivery.errors import TransientError
from delivery.message import key_digest, message_id_for, parse_sender, write_message

__all__ = ["FileChannel"]


def _write_atomically(path: Path, data: bytes) -> None:
    fd, temporary = tempfile.mkstemp(dir=path.parent, prefix=".tmp-", suffix=".eml")
    try:
        with os.fdopen(fd, "wb") as handle:
            handle.write(data)
            handle.flush()
            os.fsync(handle.fileno())
        os.replace(temporary, path)
    except BaseException:
        Path(temporary).unlink(missing_ok=True)
        raise


class FileChannel:
    """Deliver by writing ``<key digest>.eml`` files under ``directory``."""

    name = "file"
    honours_idempotency_keys = True
    max_concurrency = None

    def __init__(self, directory: str | os.PathLike[str], *, from_email: str, clock: Clock) -> None:
        self.directory = Path(directory)
        self._sender = parse_sender(from_email, setting="FileChannel from_email")
        self._clock = clock

    def path_for(self, key: str) -> Path:
        """Return the file a message with ``key`` is written to."""
        return self.directory / f"{key_digest(key)}.eml"

    async def __aenter__(self) -> Self:
        await asyncio.to_thread(self.directory.mkdir, parents=True, exist_ok=True)
        return self

    async def __aexit__(self, *exc_info) -> None:
        return None

    async def send(self, envelope: Envelope) -> str:
        message = write_message(envelope, sender=self._sender, date=self._clock.now())
        path = self.path_for(envelope.key)
        try:
            await asyncio.to_thread(_write_atomically, path, message.data)
        except OSError as exc:
            raise TransientError(f"could not write {path}: {exc}") from exc
        return message_id_for(envelope.key, self._sender.domain)
