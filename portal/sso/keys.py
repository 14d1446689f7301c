"""The RSA key that signs ID tokens: given by setting, or generated once into the data directory."""

from __future__ import annotations

from pathlib import Path

from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric import rsa


def signing_key(data_dir: Path, given: str = "") -> str:
    """PEM text of the private key; a file made with mode 600 the first time, like the secret key."""
    if given:
        return given
    path = data_dir / "oidc_rsa_key.pem"
    if not path.exists():
        data_dir.mkdir(parents=True, exist_ok=True)
        key = rsa.generate_private_key(public_exponent=65537, key_size=2048)
        pem = key.private_bytes(
            serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()
        )
        path.touch(mode=0o600)
        path.write_bytes(pem)
    return path.read_text()
