"""Each person's work/ volume is named by a random id made once for them, never by their account number."""

from __future__ import annotations

import pytest
from django.contrib.auth.models import User

from sessions.notebooks.models import WorkVolume

pytestmark = pytest.mark.django_db


def test_a_person_keeps_one_volume_name(alice: User) -> None:
    assert WorkVolume.for_owner(alice.pk).name == WorkVolume.for_owner(alice.pk).name


def test_two_people_never_share_a_volume(alice: User, bob: User) -> None:
    assert WorkVolume.for_owner(alice.pk).name != WorkVolume.for_owner(bob.pk).name


def test_an_account_with_the_same_number_after_a_reset_gets_a_new_volume(alice: User) -> None:
    before = WorkVolume.for_owner(alice.pk).name
    WorkVolume.objects.all().delete()  # what a database reset (or a second portal's database) looks like
    after = WorkVolume.for_owner(alice.pk).name
    assert after != before
    assert str(alice.pk) not in after.removeprefix("gpu-portal-work-").split("-")
    assert len(after.removeprefix("gpu-portal-work-")) == 32
