from django.apps import AppConfig


class ExportsConfig(AppConfig):
    name = "coevo.exports"
    verbose_name = "Trajectory exports"

    def ready(self) -> None:
        # Connect the retention protection of the evaluations exports were built from.
        from coevo.exports import retention  # noqa: F401
