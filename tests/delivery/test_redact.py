"""No password or token of a URL reaches an error, a log line or ``last_error`` (issue 11, item 5)."""

from __future__ import annotations

import logging

import pytest

from delivery import DeliveryLimits, Outcome, deliver
from delivery.channels import HttpChannel, HttpSettings
from delivery.redact import redact_text, redact_url
from loopback.http_sink import HttpSink
from tests.delivery.conftest import run

QUICK = DeliveryLimits(concurrency=2, call_timeout=5, max_attempts=2, backoff_base=0.01)
TOKEN = "Tk-9f3a7c1e"


@pytest.mark.parametrize(
    ("url", "shown"),
    [
        ("redis://:Tk-9f3a7c1e@redis:6379/0", "redis://:***@redis:6379/0"),
        ("postgres://app:Tk-9f3a7c1e@db:5432/x", "postgres://app:***@db:5432/x"),
        ("https://Tk-9f3a7c1e@hooks.example.com/r", "https://***@hooks.example.com/r"),
        (
            "https://n.example.com/r?token=Tk-9f3a7c1e&v=2",
            "https://n.example.com/r?token=***&v=***",
        ),
        ("https://n.example.com/r?Tk-9f3a7c1e", "https://n.example.com/r?***"),
        ("https://n.example.com/r#Tk-9f3a7c1e", "https://n.example.com/r"),
        ("https://n.example.com:8443/v1/r", "https://n.example.com:8443/v1/r"),
        ("http://[::1/r", "***"),  # unparseable: masked whole
    ],
)
def test_a_url_keeps_where_it_points_and_loses_its_credentials(url, shown):
    assert redact_url(url) == shown


@pytest.mark.parametrize("c", list(":/?#[]@!$&'()*+,;=%"))
@pytest.mark.parametrize(
    ("template", "kept"),
    [
        ("amqp://guest:Pw{c}Sx@rabbit//", "amqp://guest:***@rabbit//"),
        ("redis://:Pw{c}Sx@redis:6379/0", "redis://:***@redis:6379/0"),
        ("postgres://app:{c}Pw{c}Sx{c}@db:5432/x", "postgres://app:***@db:5432/x"),
    ],
)
def test_a_password_with_any_reserved_character_never_shows(template, kept, c):
    """Issue 34, item 5: ``amqp://guest:pa/ss@rabbit//`` was printed whole, and ``pa#ss``
    leaked ``pa``. Every reserved character of RFC 3986, and ``%``, in the password."""
    shown = redact_url(template.format(c=c))
    assert "Pw" not in shown and "Sx" not in shown, shown
    assert shown == kept


@pytest.mark.parametrize("c", list("/?#[]@!$&'()*+,;=%"))
def test_a_token_as_user_info_with_any_reserved_character_never_shows(c):
    shown = redact_url(f"https://Tk{c}Zq@hooks.example.com/r")
    assert "Tk" not in shown and "Zq" not in shown, shown
    assert shown == "https://***@hooks.example.com/r"


def test_the_broker_url_of_the_report_keeps_its_host_and_user():
    assert redact_url("amqp://guest:pa/ss@rabbit//") == "amqp://guest:***@rabbit//"
    assert redact_url("redis://:p#a?s/s@redis:6379/0") == "redis://:***@redis:6379/0"
    assert redact_text("broker amqp://guest:pa/ss@rabbit// down") == (
        "broker amqp://guest:***@rabbit// down"
    )


def test_every_url_inside_a_message_is_redacted():
    text = f"could not reach redis://:{TOKEN}@r:6379/0 nor 'https://h/x?k={TOKEN}'; giving up"
    assert redact_text(text) == (
        "could not reach redis://:***@r:6379/0 nor 'https://h/x?k=***'; giving up"
    )


@pytest.mark.parametrize("q", ["'", '"'], ids=["single", "double"])
@pytest.mark.parametrize(
    ("template", "shown"),
    [
        (
            "connect to https://ops:Pw{q}Sx@host/r failed",
            "connect to https://ops:***@host/r failed",
        ),
        ("connect to https://Tk{q}Zq@host/r failed", "connect to https://***@host/r failed"),
        ("url=<https://ops:Pw{q}Sx@host/r>", "url=<https://ops:***@host/r>"),
        ("redis://:{q}Pw{q}Sx{q}@redis:6379/0 down", "redis://:***@redis:6379/0 down"),
    ],
    ids=["password", "token", "in-brackets", "quotes-only"],
)
def test_a_password_holding_a_quote_never_shows_in_a_message(template, shown, q):
    """A quote is allowed in user info: the URL does not end there (it did, and the
    password, then its host, were kept whole)."""
    assert redact_text(template.format(q=q)) == shown


@pytest.mark.parametrize(
    "url", ["https://ops:Pw'Sx@host/r", 'https://ops:Pw"Sx@host/r'], ids=["single", "double"]
)
def test_a_quoted_url_whose_password_holds_a_quote_keeps_its_quotes(url):
    """As repr() and %r write it: the closing quote after the host still ends the URL."""
    q = repr(url)[0]  # the quote repr() chose: the other one is in the password
    assert redact_text(f"got {url!r}; giving up") == f"got {q}https://ops:***@host/r{q}; giving up"


def _own_log_lines(caplog) -> str:
    """What this project's loggers wrote (libraries' lines are redacted by the handler:
    tests/config/test_secrets.py)."""
    return "\n".join(r.getMessage() for r in caplog.records if r.name.startswith("delivery"))


def _deliver(url: str, system_clock, make_real_envelope, caplog):
    channel = HttpChannel(HttpSettings(url=url, secret="s", timeout=5), clock=system_clock)
    with caplog.at_level(logging.DEBUG):
        [result] = run(deliver([make_real_envelope()], channel, policy=QUICK, clock=system_clock))
    return result


@pytest.mark.parametrize("status", [500, 404, 429])
def test_an_http_error_names_the_endpoint_without_its_token(
    status, system_clock, make_real_envelope, caplog
):
    with HttpSink(secret="s") as sink:
        sink.configure(fail_status=status, retry_after=0.01)
        result = _deliver(f"{sink.url}?token={TOKEN}", system_clock, make_real_envelope, caplog)
    assert result.outcome is not Outcome.SENT
    assert f"HTTP {status} from {sink.url}?token=***" in result.error
    assert TOKEN not in result.error
    assert TOKEN not in _own_log_lines(caplog)


def test_a_connection_error_names_the_endpoint_without_its_token(
    system_clock, make_real_envelope, caplog, refusing_port
):
    port = refusing_port()
    url = f"http://user:{TOKEN}@127.0.0.1:{port}/r?token={TOKEN}"
    result = _deliver(url, system_clock, make_real_envelope, caplog)
    assert result.outcome is Outcome.TRANSIENT
    assert f"could not connect to http://user:***@127.0.0.1:{port}/r?token=***" in result.error
    assert TOKEN not in result.error
    assert TOKEN not in _own_log_lines(caplog)


def test_a_refused_setting_does_not_echo_the_token():
    with pytest.raises(ValueError) as refused:
        HttpSettings(url=f"http://notify.example.com/r?token={TOKEN}", secret="s")
    assert TOKEN not in str(refused.value)
