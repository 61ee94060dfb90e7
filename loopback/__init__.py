"""Real servers on 127.0.0.1 that stand in for providers in tests, benchmarks and chaos runs.

- ``loopback.http_sink``: an HTTP provider implementing ``delivery/HTTP_CONTRACT.md``.
- ``loopback.smtp_sink``: an SMTP server (aiosmtpd) recording what it receives.

Both run in-process (a background thread, ``with Sink() as sink:``) or as a
process (``python -m loopback.http_sink --port P``). Neither imports Django
nor ``delivery``: they check the contract from the provider's side.
"""
