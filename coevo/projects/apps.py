from django.apps import AppConfig


class ProjectsConfig(AppConfig):
    name = "coevo.projects"
    label = "projects"
