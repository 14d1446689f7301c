"""The RSA key that signs ID tokens: given by setting, or generated once into the data directory."""

from __future__ import annotations

from pathlib import Path

from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric import rsa

from portal.datafiles import secret_file


def _new_key() -> str:
    key = rsa.generate_private_key(public_exponent=65537, key_size=2048)
    pem = key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption())
    return pem.decode()


def signing_key(data_dir: Path, given: str = "") -> str:
    """PEM text of the private key that signs ID tokens. Given on one line (an env file holds no other), its line
    breaks are written as \\n."""
    if given and "\n" not in given:
        given = given.replace("\\n", "\n")
    return given or secret_file(data_dir / "oidc_rsa_key.pem", _new_key, "PORTAL_OIDC_RSA_PRIVATE_KEY")
