"""A person's storage as pages and refusals say it: used of quota, what uses it (largest first, each with its
parts), and what they can remove. The render page and the sessions page show the same section
(``sessions/storage/templates/sessions/storage_use.html``), each adding the removals it offers."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

from sessions.runtime.watchdogs import size_words
from sessions.storage.models import StorageUse
from sessions.storage.usage import Usage

MOST_NAMED = 5  # a refusal names the largest few things; the page lists them all
REMOVE = (
    "remove what you no longer need: cancel render jobs or remove their files on the Render jobs page, and "
    "delete files in your notebook's work/ folder from JupyterLab"
)


@dataclass(frozen=True)
class Removal:
    """A POST that frees an item's bytes (cancel a job, remove its files, discard an upload)."""

    url: str
    label: str
    described: str  # its accessible name: what it does to which thing


@dataclass(frozen=True)
class Row:
    item: StorageUse
    size: str
    parts: str
    percent: int  # of the quota
    removal: Removal | None


def part_words(item: StorageUse) -> str:
    """Its parts, in words: "scene 1.2 GiB, frames 3 GiB"; empty where it has none."""
    return ", ".join(f"{name} {size_words(int(size))}" for name, size in item.parts.items() if size)


def item_words(item: StorageUse) -> str:
    parts = part_words(item)
    return f"{item.get_kind_display().lower()} '{item.label}' {size_words(item.bytes)}" + (
        f" ({parts})" if parts else ""
    )


def used_words(usage: Usage) -> str:
    """ "You use 4.2 GiB of your 5 GiB storage quota: render job 'shot.blend' 3 GiB (scene ..., frames ...), ..."."""
    named = "; ".join(item_words(item) for item in usage.items[:MOST_NAMED])
    more = len(usage.items) - MOST_NAMED
    others = f"; and {more} more" if more > 0 else ""
    what = f": {named}{others}" if named else ""
    return f"You use {size_words(usage.used)} of your {size_words(usage.limit)} storage quota{what}"


def rows(usage: Usage, removals: Mapping[tuple[str, str], Removal] | None = None) -> list[Row]:
    removals = removals or {}
    return [
        Row(
            item,
            size_words(item.bytes),
            part_words(item),
            min(100, round(100 * item.bytes / usage.limit)) if usage.limit else 100,
            removals.get((item.kind, item.key)),
        )
        for item in usage.items
    ]


@dataclass(frozen=True)
class Section:
    """What the storage section of a page shows."""

    usage: Usage
    rows: list[Row]

    @property
    def used(self) -> str:
        return size_words(self.usage.used)

    @property
    def limit(self) -> str:
        return size_words(self.usage.limit)


def section(usage: Usage, removals: Mapping[tuple[str, str], Removal] | None = None) -> Section:
    return Section(usage, rows(usage, removals))
