"""delivery/HTTP_CONTRACT.md's sample verifier, run as it stands in the document.

It must accept what the sender really sends, reject any change to the key,
timestamp or body, and turn every malformed header into a plain ``False``
(a receiver answers 401), never an exception (a 500). The loopback sink,
which verifies on its own code, answers the same malformed headers with 401.
"""

from __future__ import annotations

import re
from pathlib import Path

import httpx
import pytest

from clock import SystemClock
from delivery.channels.http import CONTRACT_VERSION, encode_body, signed_headers
from loopback.http_sink import HttpSink

CONTRACT = Path(__file__).resolve().parents[2] / "delivery" / "HTTP_CONTRACT.md"
SECRET = "contract-secret-0a1b2c3d4e5f6a7b8c"


def _verify():
    text = CONTRACT.read_text()
    blocks = re.findall(r"```python\n(.*?)```", text, flags=re.DOTALL)
    [code] = [block for block in blocks if "def verify(" in block]
    namespace: dict = {}
    exec(compile(code, str(CONTRACT), "exec"), namespace)  # the document's own code
    return namespace["verify"]


@pytest.fixture
def request_parts(make_real_envelope):
    envelope = make_real_envelope()
    body = encode_body(envelope)
    headers = signed_headers(
        secret=SECRET,
        key=envelope.key,
        body=body,
        timestamp=str(int(SystemClock().now().timestamp())),
    )
    return headers, body


def test_the_document_names_the_version_the_sender_speaks():
    text = CONTRACT.read_text()
    assert text.startswith(f"# HTTP delivery contract (version {CONTRACT_VERSION})")
    assert f"contract version, `{CONTRACT_VERSION}`" in text


def test_the_sample_verifier_accepts_the_senders_request_and_nothing_altered(request_parts):
    verify = _verify()
    headers, body = request_parts
    ts, key, sig = (
        headers["X-Reminders-Timestamp"],
        headers["Idempotency-Key"],
        headers["X-Reminders-Signature"],
    )
    assert verify(SECRET, ts, key, sig, body)
    assert not verify("other-secret", ts, key, sig, body)
    assert not verify(SECRET, ts, key + "x", sig, body), "the key is not covered"
    assert not verify(SECRET, str(int(ts) + 1), key, sig, body)
    assert not verify(SECRET, ts, key, sig, body + b" ")
    assert not verify(SECRET, str(int(ts) - 301), key, sig, body)


MALFORMED = [
    ("timestamp", "abc"),
    ("timestamp", ""),
    ("timestamp", "-5"),
    ("timestamp", "1e9"),
    ("timestamp", "²"),  # isdigit() is True, int() raises
    ("timestamp", "9" * 5000),  # int() refuses more than 4300 digits
    ("signature", "sha256=é" + "0" * 63),  # compare_digest raises on non-ASCII text
    ("signature", "sha256=" + "0" * 63),
    ("signature", "md5=abc"),
    ("signature", ""),
    ("key", "clé"),
]


@pytest.mark.parametrize(("part", "value"), MALFORMED)
def test_the_sample_verifier_says_false_to_malformed_headers_and_never_raises(
    request_parts, part, value
):
    headers, body = request_parts
    parts = {
        "timestamp": headers["X-Reminders-Timestamp"],
        "key": headers["Idempotency-Key"],
        "signature": headers["X-Reminders-Signature"],
    }
    parts[part] = value
    assert _verify()(SECRET, parts["timestamp"], parts["key"], parts["signature"], body) is False


@pytest.mark.parametrize(("part", "value"), MALFORMED)
def test_the_sink_answers_malformed_headers_with_401(request_parts, part, value):
    headers, body = request_parts
    name = {
        "timestamp": "X-Reminders-Timestamp",
        "signature": "X-Reminders-Signature",
        "key": "Idempotency-Key",
    }[part]
    raw = [(k.encode(), v.encode()) for k, v in headers.items() if k != name]
    raw.append((name.encode(), value.encode("utf-8")))
    with HttpSink(secret=SECRET) as sink, httpx.Client() as client:
        response = client.post(sink.url, content=body, headers=raw)
        assert response.status_code == 401, response.text
        assert sink.stats()["bad_signatures"] == 1
