"""factory_boy factories shared by the tests."""

from __future__ import annotations

import factory
from django.contrib.auth.models import Group, User

PASSWORD = "correct horse battery staple"


class UserFactory(factory.django.DjangoModelFactory[User]):
    class Meta:
        model = User
        django_get_or_create = ("username",)
        skip_postgeneration_save = True

    username = factory.Sequence(lambda n: f"user{n}")
    email = factory.LazyAttribute(lambda user: f"{user.username}@example.org")
    password = factory.PostGenerationMethodCall("set_password", PASSWORD)

    @factory.post_generation
    def roles(self, create: bool, extracted: list[str] | None, **kwargs: object) -> None:
        if not create:
            return
        for name in extracted or ["users"]:
            self.groups.add(  # type: ignore[attr-defined]
                Group.objects.get_or_create(name=name)[0]
            )
        self.save()  # type: ignore[attr-defined]


def make_user(username: str, roles: list[str], **fields: object) -> User:
    user = UserFactory(username=username, roles=roles, **fields)
    assert isinstance(user, User)
    return user
