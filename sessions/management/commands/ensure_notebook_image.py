"""Put the locally built notebook image on the list of images, unless staff already curated one."""

from __future__ import annotations

from typing import Any

from django.core.management.base import BaseCommand

from sessions.notebooks.models import NotebookImage


class Command(BaseCommand):
    help = "Offer the locally built JupyterLab image when the image list is empty."

    def handle(self, *args: Any, **options: Any) -> None:
        if NotebookImage.objects.exists():
            return
        NotebookImage.objects.create(
            name="JupyterLab",
            image="gpu-portal/notebook:latest",
            description="JupyterLab 4 with Python 3.11, built on this host",
            default=True,
        )
        self.stdout.write("images: offering gpu-portal/notebook:latest as 'JupyterLab'")
