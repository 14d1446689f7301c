"""The scene upload's HTTP side: the tus 1.0 protocol (core, creation and termination), which the page's vendored
tus-js-client speaks, and any other tus client can.

POST makes an upload of a declared length; PATCH adds one part at the offset the server has; HEAD says that
offset, so a client whose connection dropped resumes from it; DELETE cancels. Every part is at most
PORTAL_RENDER_UPLOAD_PART_BYTES, the limit the public entry holds the upload route to, so no request body daphne
holds is larger. Refusals answer in words (text/plain), with the protocol's status codes.
"""

from __future__ import annotations

import base64
import binascii
from collections.abc import Callable
from functools import wraps

from django.conf import settings
from django.contrib.auth.models import User
from django.http import HttpResponse
from django.urls import reverse
from django.views.decorators.cache import never_cache
from django.views.decorators.http import require_http_methods

from portal.http import PortalRequest
from portal.roles import can_launch, launch_refusal
from sessions.render import uploads
from sessions.render.limits import Refused

VERSION = "1.0.0"
PART_TYPE = "application/offset+octet-stream"
View = Callable[..., HttpResponse]


def _answer(status: int, words: str = "", **headers: str) -> HttpResponse:
    response = HttpResponse(words + "\n" if words else "", status=status, content_type="text/plain; charset=utf-8")
    response["Tus-Resumable"] = VERSION
    for name, value in headers.items():
        response[name.replace("_", "-")] = value
    return response


def _refusal(refused: Refused) -> HttpResponse:
    headers = {"Retry_After": str(refused.retry_after)} if refused.retry_after else {}
    return _answer(refused.status, refused.message, **headers)


def tus_view(view: View) -> View:
    """The protocol's common part: OPTIONS answers what this server does; every other request must be a tus 1.0
    one from someone logged in who may render; a Refused becomes its answer."""

    @wraps(view)
    def checked(request: PortalRequest, *args: object, **kwargs: object) -> HttpResponse:
        if request.method == "OPTIONS":
            return _answer(
                204,
                Tus_Version=VERSION,
                Tus_Extension="creation,termination",
                Tus_Max_Size=str(settings.RENDER_MAX_UPLOAD_BYTES),
            )
        if request.headers.get("Tus-Resumable") != VERSION:
            return _answer(412, "This server speaks tus 1.0.0.", Tus_Version=VERSION)
        if not request.user.is_authenticated:
            return _answer(403, "Log in to upload a scene.")
        if not can_launch(request.user):
            return _answer(403, launch_refusal())
        try:
            return view(request, *args, **kwargs)
        except Refused as refused:
            return _refusal(refused)

    return checked


def _person(request: PortalRequest) -> User:
    assert isinstance(request.user, User)
    return request.user


def _file_name(metadata: str) -> str:
    """The ``filename`` of an Upload-Metadata header (comma-separated ``key base64value`` pairs)."""
    for pair in metadata.split(","):
        key, _, value = pair.strip().partition(" ")
        if key == "filename":
            try:
                return base64.b64decode(value, validate=True).decode()
            except (binascii.Error, UnicodeDecodeError):
                break
    raise Refused(400, "Say the file's name (Upload-Metadata: filename <base64>).")


def _whole_number(request: PortalRequest, header: str) -> int:
    value = request.headers.get(header, "")
    if not value.isdigit():
        raise Refused(400, f"{header} must be a whole number of bytes.")
    return int(value)


@never_cache
@require_http_methods(["POST", "OPTIONS"])
@tus_view
def create(request: PortalRequest) -> HttpResponse:
    if "Upload-Defer-Length" in request.headers:
        raise Refused(400, "Say the file's size when the upload begins (Upload-Length).")
    name = _file_name(request.headers.get("Upload-Metadata", ""))
    upload = uploads.begin(_person(request), name, _whole_number(request, "Upload-Length"))
    return _answer(201, Location=reverse("render-upload-part", args=[upload.token]), Upload_Offset="0")


@never_cache
@require_http_methods(["HEAD", "PATCH", "DELETE", "OPTIONS"])
@tus_view
def part(request: PortalRequest, token: str) -> HttpResponse:
    person = _person(request)
    if request.method == "PATCH":
        if request.content_type != PART_TYPE:
            raise Refused(415, f"A part is sent as {PART_TYPE}.")
        offset = _whole_number(request, "Upload-Offset")
        if not str(request.META.get("CONTENT_LENGTH", "")).isdigit():
            raise Refused(411, "Send each part with its Content-Length.")
        size = int(request.META["CONTENT_LENGTH"])
        upload = uploads.append(person, token, offset, request, size)
        return _answer(204, Upload_Offset=str(upload.offset))
    upload = uploads.find(person, token)
    if request.method == "DELETE":
        uploads.discard(upload)
        return _answer(204)
    return _answer(200, Upload_Offset=str(upload.offset), Upload_Length=str(upload.length))
