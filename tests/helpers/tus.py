"""A scene upload over real HTTP, as the page's script makes it: the file in parts (tus), then the form that names
it with the file's SHA-256. Parts are made on the fly by a function of the offset, so a test can send a GiB
without a file of it anywhere; the connection of one part can be cut mid-way to test resuming."""

from __future__ import annotations

import base64
import hashlib
import http.client
import secrets
from collections.abc import Callable
from dataclasses import dataclass, field
from urllib.parse import urlencode

from django.urls import reverse

from tests.render.conftest import form_fields

TUS = {"Tus-Resumable": "1.0.0"}
Bytes = Callable[[int, int], bytes]  # (offset, size) -> that part of the file


@dataclass
class HttpUploader:
    """One person's uploads to the portal at 127.0.0.1:``port`` (the public entry, or daphne itself)."""

    port: int
    session: str  # "sessionid=..."
    csrf: str = field(default_factory=lambda: secrets.token_hex(16))  # Django takes an unmasked secret
    connection: http.client.HTTPConnection | None = None

    def headers(self, **extra: str) -> dict[str, str]:
        named = {name.replace("_", "-"): value for name, value in extra.items()}
        return {"Cookie": f"{self.session}; csrftoken={self.csrf}", "X-CSRFToken": self.csrf, **TUS, **named}

    def request(self, method: str, path: str, body: bytes = b"", **headers: str) -> http.client.HTTPResponse:
        """One request on the kept-alive connection. The proxy closes a connection left idle for seconds (the
        test may spend them hashing a GiB); as browsers and urllib3 do, a request that finds its reused
        connection closed before any answer is sent again once on a new one."""
        reused = self.connection is not None
        try:
            return self.exchange(method, path, body, headers)
        except (BrokenPipeError, ConnectionResetError, http.client.RemoteDisconnected):
            if not reused:
                raise
            self.connection = None
            return self.exchange(method, path, body, headers)

    def exchange(self, method: str, path: str, body: bytes, headers: dict[str, str]) -> http.client.HTTPResponse:
        if self.connection is None:
            self.connection = http.client.HTTPConnection("127.0.0.1", self.port, timeout=60)
        self.connection.request(method, path, body=body, headers=self.headers(**headers))
        response = self.connection.getresponse()
        response.read()
        return response

    def begin(self, name: str, length: int) -> http.client.HTTPResponse:
        metadata = "filename " + base64.b64encode(name.encode()).decode()
        return self.request(
            "POST", reverse("render-upload-create"), Upload_Length=str(length), Upload_Metadata=metadata
        )

    def offset(self, location: str) -> int:
        answer = self.request("HEAD", location)
        assert answer.status == 200, answer.status
        return int(answer.headers["Upload-Offset"])

    def send(self, location: str, offset: int, part: bytes) -> http.client.HTTPResponse:
        return self.request(
            "PATCH", location, part, Content_Type="application/offset+octet-stream", Upload_Offset=str(offset)
        )

    def cut_off(self, location: str, offset: int, part: bytes) -> None:
        """Send a part's head and half its body, then drop the connection, as a network that fails does."""
        connection = http.client.HTTPConnection("127.0.0.1", self.port, timeout=60)
        connection.putrequest("PATCH", location)
        headers = self.headers(Content_Type="application/offset+octet-stream", Upload_Offset=str(offset))
        headers["Content-Length"] = str(len(part))
        for name, value in headers.items():
            connection.putheader(name, value)
        connection.endheaders()
        connection.send(part[: len(part) // 2])
        connection.close()

    def form(self, token: str, sha256: str, **overrides: str) -> http.client.HTTPResponse:
        fields = {**form_fields(**overrides), "upload": token, "sha256": sha256, "csrfmiddlewaretoken": self.csrf}
        return self.request(
            "POST",
            reverse("render-job-upload"),
            urlencode(fields).encode(),
            Content_Type="application/x-www-form-urlencoded",
        )


def upload_over_http(uploader: HttpUploader, name: str, length: int, part_of: Bytes, part: int) -> tuple[str, str]:
    """Send a whole file in parts; returns the upload's token and the file's SHA-256."""
    created = uploader.begin(name, length)
    assert created.status == 201, created.status
    location = created.headers["Location"]
    digest = hashlib.sha256()
    for offset in range(0, length, part):
        data = part_of(offset, min(part, length - offset))
        answer = uploader.send(location, offset, data)
        assert answer.status == 204, answer.status
        digest.update(data)
    return location.rstrip("/").rsplit("/", 1)[1], digest.hexdigest()
