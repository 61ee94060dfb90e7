"""ThreadedChannel: blocking senders inside the async limits."""

from __future__ import annotations

import smtplib
import threading

import pytest

from delivery import DeliveryLimits, Outcome, PermanentError, TransientError, deliver
from delivery.channels import ThreadedChannel
from delivery.channels.smtp import translate_smtplib_error
from tests.delivery.conftest import deliver_once, run

pytestmark = pytest.mark.timeout(30)


def test_blocking_sends_run_in_threads_within_the_concurrency_limit(
    system_clock, make_real_envelope
):
    lock = threading.Lock()
    running = 0
    peak = 0
    # Four at a time meet here, however late a loaded host starts their threads: fewer
    # break it (a failed send), more show in the peak.
    together = threading.Barrier(4)

    def send(envelope):
        nonlocal running, peak
        with lock:
            running += 1
            peak = max(peak, running)
        together.wait(10)
        system_clock.sleep_blocking(0.05)  # still running when a fifth would start
        with lock:
            running -= 1
        return f"django-{envelope.reminder_id}"

    envelopes = [make_real_envelope() for _ in range(12)]

    results = deliver_once(
        envelopes,
        lambda: ThreadedChannel("django-mail", send),
        policy=DeliveryLimits(concurrency=4),
        clock=system_clock,
    )

    assert [r.message_id for r in results] == [f"django-{e.reminder_id}" for e in envelopes]
    assert peak == 4  # four sends at once in four threads: the fan-out, without a time bound


def test_a_timed_out_thread_is_reported_and_left_to_finish_in_the_background(
    system_clock, make_real_envelope
):
    """The batch returns at the call timeout; the stuck thread finishes later on its own."""
    release = threading.Event()
    finished = threading.Event()
    channels: list[ThreadedChannel] = []

    def send(envelope):
        release.wait(10)
        finished.set()
        return "late"

    def factory():
        channels.append(ThreadedChannel("django-mail", send))
        return channels[-1]

    began = system_clock.monotonic()
    [result] = deliver_once(
        [make_real_envelope()],
        factory,
        policy=DeliveryLimits(call_timeout=0.2),
        clock=system_clock,
    )
    elapsed = system_clock.monotonic() - began

    assert result.outcome is Outcome.TIMED_OUT
    assert (result.attempts, result.provider_reached, result.maybe_delivered) == (1, True, True)
    # The thread still hangs (until release): the 0.2 s timeout, not the send, ended the
    # call. Fifty times the timeout is a bound no loaded runner comes near.
    assert elapsed < 0.2 * 50
    assert channels[0].running_threads == 1
    release.set()
    assert finished.wait(5)


@pytest.mark.parametrize(
    ("error", "outcome", "attempts"),
    [
        (PermanentError("550 no such user"), Outcome.PERMANENT, 1),
        (smtplib.SMTPServerDisconnected("lost"), Outcome.TRANSIENT, 1),
    ],
)
def test_errors_raised_in_the_thread_are_classified_like_any_channel_error(
    system_clock, make_real_envelope, error, outcome, attempts
):
    """A lost SMTP connection is an unknown outcome: not retried without keys."""

    def send(envelope):
        raise error

    [result] = deliver_once(
        [make_real_envelope()],
        lambda: ThreadedChannel("django-mail", send),
        policy=DeliveryLimits(max_attempts=3, backoff_base=0.01),
        clock=system_clock,
    )

    assert (result.outcome, result.attempts) == (outcome, attempts)


def test_smtplib_errors_from_a_blocking_sender_are_translated_by_reply_code(
    system_clock, make_real_envelope
):
    """A Django-style sender refused 550 fails permanently; 451 is retried; refused port
    never reached the provider."""
    from loopback.smtp_sink import SmtpSink

    with SmtpSink() as sink:
        refused, greylisted = make_real_envelope(), make_real_envelope()
        sink.script_rcpt(refused.recipient, "550 5.1.1 No such user")
        sink.script_rcpt(greylisted.recipient, "451 4.7.1 Greylisted")

        def send(envelope):
            try:
                with smtplib.SMTP("127.0.0.1", sink.port, timeout=5) as client:
                    client.sendmail("r@example.org", [envelope.recipient], b"Subject: hi\r\n\r\nx")
            except Exception as exc:
                raise translate_smtplib_error(exc) from exc
            return "ok"

        results = deliver_once(
            [refused, greylisted],
            lambda: ThreadedChannel("django-mail", send),
            policy=DeliveryLimits(max_attempts=3, backoff_base=0.01),
            clock=system_clock,
        )

    assert (results[0].outcome, results[0].error) == (
        Outcome.PERMANENT,
        "SMTP 550 on RCPT TO: 5.1.1 No such user",
    )
    assert (results[1].outcome, results[1].attempts) == (Outcome.SENT, 2)
    assert isinstance(translate_smtplib_error(ConnectionRefusedError()), TransientError)
    assert translate_smtplib_error(ConnectionRefusedError()).reached is False


def test_a_send_that_ends_after_its_timeout_is_only_logged(
    system_clock, make_real_envelope, caplog
):
    """The result came too late for the batch, which counts it maybe delivered; the log says."""
    answer = threading.Event()  # the send answers only once the batch has timed it out
    channel = ThreadedChannel("django-mail", lambda envelope: answer.wait(10) and "id-7")

    async def scenario():
        results = await deliver(
            [make_real_envelope()],
            channel,
            policy=DeliveryLimits(call_timeout=0.1),
            clock=system_clock,
        )
        answer.set()
        # The loop stays open until the late result is reported (or 5 s pass).
        deadline = system_clock.monotonic() + 5.0
        while "finished late" not in caplog.text and system_clock.monotonic() < deadline:
            await system_clock.sleep(0.02)
        return results

    [result] = run(scenario())

    assert result.outcome is Outcome.TIMED_OUT
    assert "finished late: sent as id-7" in caplog.text


def test_a_thread_that_cannot_start_is_not_counted_as_running(
    system_clock, make_real_envelope, monkeypatch, caplog
):
    """The host is out of threads: the send fails as never having reached the provider (a
    channel without keys would otherwise call it maybe sent), and the channel does not go on
    counting a thread that never ran (nor warn at the end of the batch that it still runs)."""
    real_start = threading.Thread.start

    def start(thread):
        if thread.name.startswith("delivery-"):
            raise RuntimeError("can't start new thread")
        real_start(thread)

    monkeypatch.setattr(threading.Thread, "start", start)
    channel = ThreadedChannel("django-mail", lambda envelope: "never")

    [result] = run(
        deliver([make_real_envelope()], channel, policy=DeliveryLimits(), clock=system_clock)
    )

    assert (result.outcome, result.provider_reached, result.maybe_delivered) == (
        Outcome.TRANSIENT, False, False,
    )  # fmt: skip
    assert "can't start new thread" in result.error
    assert channel.running_threads == 0
    assert "still running in the background" not in caplog.text


def test_a_send_that_ends_after_its_batchs_event_loop_closed_is_still_logged(
    system_clock, make_real_envelope, caplog
):
    """The batch timed the send out and its event loop is gone when the thread finishes:
    the late result has no loop to go back to, and is logged from the thread instead."""
    answer = threading.Event()
    envelope = make_real_envelope()
    channel = ThreadedChannel("django-mail", lambda envelope: answer.wait(10) and "id-7")

    [result] = run(
        deliver([envelope], channel, policy=DeliveryLimits(call_timeout=0.1), clock=system_clock)
    )
    [thread] = [
        t for t in threading.enumerate() if t.name == f"delivery-django-mail-{envelope.reminder_id}"
    ]
    answer.set()
    thread.join(5)

    assert result.outcome is Outcome.TIMED_OUT
    assert not thread.is_alive()
    assert channel.running_threads == 0
    assert "finished late: sent as id-7" in caplog.text
