from django.apps import AppConfig


class RemindersConfig(AppConfig):
    name = "reminders"
    verbose_name = "Reminders"

    def ready(self) -> None:
        from reminders import checks, receivers  # noqa: F401  (registers checks, signals)
