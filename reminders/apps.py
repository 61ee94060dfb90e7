from django.apps import AppConfig


class RemindersConfig(AppConfig):
    name = "reminders"
    verbose_name = "Reminders"

    def ready(self) -> None:
        from django.db.backends.signals import connection_created

        from reminders import checks, locks, receivers  # noqa: F401  (registers checks, signals)

        connection_created.connect(locks.on_connection_created, dispatch_uid="reminders.locks")
