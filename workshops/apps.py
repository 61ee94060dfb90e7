from django.apps import AppConfig


class WorkshopsConfig(AppConfig):
    name = "workshops"
    verbose_name = "Workshops"
