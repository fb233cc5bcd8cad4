"""Test certificates made by `openssl`: a CA, a server certificate for localhost / 127.0.0.1,
a client certificate, and a stranger signed by another CA (TLS and mTLS tests).

    folder = make_pki(tmp_path)      # folder / "ca.pem", "server.pem", "server.key", ...
"""

from __future__ import annotations

import subprocess
from pathlib import Path


def _openssl(*args: str, cwd: Path) -> None:
    subprocess.run(["openssl", *args], cwd=cwd, check=True, capture_output=True, timeout=30)


def _issue(folder: Path, name: str, ca: str, extensions: str) -> None:
    """`name`.key and `name`.pem, signed by the CA `ca`.pem / `ca`.key."""
    _openssl(
        "ecparam", "-name", "prime256v1", "-genkey", "-noout", "-out", f"{name}.key", cwd=folder
    )
    _openssl(
        "req",
        "-new",
        "-key",
        f"{name}.key",
        "-subj",
        f"/CN={name}",
        "-out",
        f"{name}.csr",
        cwd=folder,
    )
    (folder / f"{name}.ext").write_text(extensions)
    _openssl(
        "x509", "-req", "-in", f"{name}.csr", "-CA", f"{ca}.pem", "-CAkey", f"{ca}.key",
        "-CAcreateserial", "-days", "2", "-extfile", f"{name}.ext", "-out", f"{name}.pem",
        cwd=folder,
    )  # fmt: skip


def _make_ca(folder: Path, name: str) -> None:
    _openssl(
        "req", "-x509", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1", "-nodes",
        "-keyout", f"{name}.key", "-out", f"{name}.pem", "-days", "2", "-subj", f"/CN={name}",
        "-addext", "basicConstraints=critical,CA:TRUE",
        "-addext", "keyUsage=critical,keyCertSign,cRLSign",
        cwd=folder,
    )  # fmt: skip


def make_pki(folder: Path) -> Path:
    """Writes ca, other-ca (CAs), server (localhost, 127.0.0.1), client and stranger (signed
    by other-ca) `.pem`/`.key` files into `folder`; returns it."""
    _make_ca(folder, "ca")
    _make_ca(folder, "other-ca")
    server_ext = "subjectAltName=DNS:localhost,IP:127.0.0.1\nextendedKeyUsage=serverAuth\n"
    _issue(folder, "server", "ca", server_ext)
    _issue(folder, "client", "ca", "extendedKeyUsage=clientAuth\n")
    _issue(folder, "stranger", "other-ca", "extendedKeyUsage=clientAuth\n")
    return folder
