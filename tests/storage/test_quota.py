"""Whose quota is what: a person's own, else the largest of their groups', else PORTAL_STORAGE_QUOTA_BYTES; and
what they use is the sum of what each thing of theirs was last measured at, nobody else's."""

from __future__ import annotations

from decimal import Decimal

import pytest
from django.contrib.auth.models import Group, User

from sessions.storage import usage
from sessions.storage.models import GroupStorageQuota, StorageQuota, StorageUse

pytestmark = pytest.mark.django_db
GIB = 1024**3
Kind = StorageUse.Kind


def test_without_any_override_a_person_has_the_settings_quota(alice: User, settings) -> None:  # type: ignore[no-untyped-def]
    settings.STORAGE_QUOTA_BYTES = 7 * GIB
    assert usage.limit_of(alice) == 7 * GIB


def test_of_several_groups_the_largest_quota_applies_over_the_setting(alice: User, bob: User, settings) -> None:  # type: ignore[no-untyped-def]
    settings.STORAGE_QUOTA_BYTES = 50 * GIB
    students, lab = Group.objects.create(name="students"), Group.objects.create(name="lab")
    GroupStorageQuota.objects.create(group=students, gib=Decimal("5"))
    GroupStorageQuota.objects.create(group=lab, gib=Decimal("20.5"))
    alice.groups.add(students)
    assert usage.limit_of(alice) == 5 * GIB, "a group's quota replaces the setting, smaller or not"
    alice.groups.add(lab)
    assert usage.limit_of(alice) == int(20.5 * GIB)
    assert usage.limit_of(bob) == 50 * GIB, "bob is in neither group"


def test_a_persons_own_quota_overrides_their_groups_and_the_setting(alice: User, settings) -> None:  # type: ignore[no-untyped-def]
    settings.STORAGE_QUOTA_BYTES = 50 * GIB
    lab = Group.objects.create(name="lab")
    GroupStorageQuota.objects.create(group=lab, gib=Decimal("100"))
    alice.groups.add(lab)
    StorageQuota.objects.create(user=alice, gib=Decimal("0.5"))
    assert usage.limit_of(alice) == GIB // 2


def test_a_persons_use_is_the_sum_of_their_own_things_only(alice: User, bob: User, settings) -> None:  # type: ignore[no-untyped-def]
    settings.STORAGE_QUOTA_BYTES = 10_000
    usage.record(
        alice.pk, Kind.RENDER_JOB, "1", label="shot.blend", size=6_000, parts={"scene": 1_000, "frames": 5_000}
    )
    usage.record(alice.pk, Kind.WORK_VOLUME, "vol-a", label="work/", size=3_000)
    usage.record(bob.pk, Kind.WORK_VOLUME, "vol-b", label="work/", size=9_000)
    usage.record(alice.pk, Kind.RENDER_JOB, "1", label="shot.blend", size=5_000)  # measured again: replaced

    found = usage.usage_of(alice)
    assert (found.used, found.left, found.full, found.percent) == (8_000, 2_000, False, 80)
    assert [item.key for item in found.items] == ["1", "vol-a"], "largest first"
    usage.forget(Kind.WORK_VOLUME, "vol-a")
    assert usage.used_by(alice.pk) == 5_000 and usage.used_by(bob.pk) == 9_000


def test_an_administrator_sets_a_groups_and_a_persons_quota_in_the_admin(alice: User, settings) -> None:  # type: ignore[no-untyped-def]
    from django.test import Client

    from portal.roles import OPERATORS, USERS
    from tests.factories import make_user

    settings.STORAGE_QUOTA_BYTES = 50 * GIB
    lab = Group.objects.create(name="lab")
    alice.groups.add(lab)
    admin = Client()
    admin.force_login(make_user("root", [USERS, OPERATORS], is_staff=True, is_superuser=True))

    added = admin.post("/admin/storage/groupstoragequota/add/", {"group": lab.pk, "gib": "2.5"})
    assert added.status_code == 302, added.content.decode()[-2000:]
    assert usage.limit_of(alice) == int(2.5 * GIB)
    added = admin.post("/admin/storage/storagequota/add/", {"user": alice.pk, "gib": "0.75"})
    assert added.status_code == 302
    assert usage.limit_of(alice) == int(0.75 * GIB)
    refused = admin.post("/admin/storage/storagequota/add/", {"user": alice.pk, "gib": "0"})
    assert refused.status_code == 200
    assert "Ensure this value is greater than or equal to 0.001" in refused.content.decode()

    usage.record(alice.pk, Kind.WORK_VOLUME, "vol-a", label="work/", size=3_000)
    listed = admin.get("/admin/storage/storageuse/").content.decode()
    assert "work/" in listed and admin.get("/admin/storage/storageuse/add/").status_code == 403
