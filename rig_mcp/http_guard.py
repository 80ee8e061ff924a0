"""What guards the MCP server's HTTP transport: the bearer token, TLS, and the Host/Origin checks.

The tools run playbooks with the operator's SSH keys, cloud credentials and vault, so whoever can
call them is the operator. Over HTTP:

- a bearer token is always required, loopback included (on a shared controller any local user
  reaches 127.0.0.1); it comes from a 0600 file of this user's (made, with a random token, when
  the file named does not exist) or RIG_MCP_TOKEN, and is compared in constant time;
- off loopback the server speaks TLS only (the token and the prompts would otherwise cross the
  network in clear text): with the certificate and key it is given, or with one it makes and keeps
  (self-signed, EC P-256, its names those the Host check accepts), or it does not start and names
  the SSH tunnel instead;
- the Host and Origin headers are checked (DNS rebinding).

Every refusal is StartRefused: one line, saying what to do.
"""

from __future__ import annotations

import contextlib
import datetime
import hmac
import ipaddress
import os
import re
import secrets
import ssl
import stat
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID
from mcp.server.auth.provider import AccessToken
from mcp.server.transport_security import TransportSecuritySettings

from rig_mcp.locks import UnsafeLockDir, private_dir

TOKEN_ENV = "RIG_MCP_TOKEN"
TOKEN_MIN = 16
# A made certificate lives a year and is made again in its last month, so a client that pinned
# it is not surprised by an expiry in the middle of a session.
CERT_DAYS = 365
CERT_RENEW_DAYS = 30
WILDCARD_BINDS = ("0.0.0.0", "::", "")
LOOPBACK_NAMES = ("127.0.0.1", "localhost", "::1")


class StartRefused(Exception):
    """The server will not start as asked: one line saying why and what to do."""


class StaticToken:
    """A TokenVerifier for one shared bearer token (compared in constant time)."""

    def __init__(self, token: str) -> None:
        self._token = token.encode()

    async def verify_token(self, token: str) -> AccessToken | None:
        if hmac.compare_digest(token.encode(), self._token):
            return AccessToken(token="rig-mcp", client_id="rig-mcp", scopes=[])
        return None


def is_loopback(host: str) -> bool:
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


# --- the token -------------------------------------------------------------------------------
def read_token_file(path: Path) -> str:
    """The token in ``path``: a regular file (not a symlink) of ours, readable by us alone."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC)
    except OSError as exc:
        raise StartRefused(f"--token-file {path}: {exc.strerror} (a symlink is refused)") from None
    with os.fdopen(fd, "rb") as f:
        st = os.fstat(f.fileno())
        if not stat.S_ISREG(st.st_mode):
            raise StartRefused(f"--token-file {path} is not a regular file")
        if st.st_uid != os.geteuid():
            raise StartRefused(f"--token-file {path} is owned by uid {st.st_uid}, not {os.geteuid()}")
        if st.st_mode & 0o077:
            raise StartRefused(
                f"--token-file {path} is readable by others (mode {stat.S_IMODE(st.st_mode):04o}): chmod 600 it"
            )
        token = f.read(4096).decode("utf-8", "replace").strip()
    if len(token) < TOKEN_MIN:
        raise StartRefused(f"--token-file {path} holds no token of {TOKEN_MIN} characters or more")
    return token


def make_token_file(path: Path) -> str | None:
    """A new random token written to ``path``, created 0600 (its missing folders 0700); None
    when ``path`` already exists (then it is read, and checked, like any token file).
    O_EXCL|O_NOFOLLOW: a file or symlink planted there first is never written through."""
    with contextlib.suppress(FileExistsError):
        path.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
    token = secrets.token_urlsafe(32)
    try:
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600)
    except FileExistsError:
        return None
    except OSError as exc:
        raise StartRefused(f"--token-file {path}: cannot create it: {exc.strerror}") from None
    with os.fdopen(fd, "w") as f:
        f.write(token + "\n")
    return token


def http_token(token_file: Path | None, environ: dict[str, str] | os._Environ[str]) -> tuple[str, str]:
    """The bearer token every HTTP request must carry, and a line to print (or ""); StartRefused
    when there is none: the server never serves HTTP without one, not even on loopback."""
    if token_file is not None:
        made = make_token_file(token_file) if not os.path.lexists(token_file) else None
        if made is not None:
            return made, (
                f"made --token-file {token_file} (mode 0600, a new random token): "
                "clients send its contents as Authorization: Bearer TOKEN"
            )
        return read_token_file(token_file), ""
    token = environ.get(TOKEN_ENV, "").strip()
    if token:
        if len(token) < TOKEN_MIN:
            raise StartRefused(f"{TOKEN_ENV} holds no token of {TOKEN_MIN} characters or more")
        return token, ""
    raise StartRefused(
        f"--http needs a bearer token, loopback included: give --token-file FILE "
        f"(made 0600 with a random token when FILE does not exist) or {TOKEN_ENV}"
    )


# --- TLS -------------------------------------------------------------------------------------
@dataclass(frozen=True)
class Tls:
    cert: Path
    key: Path
    fingerprint: str  # SHA-256 of the certificate, AA:BB:..., what a client pins
    how: str  # "given", "made" or "reused"

    def line(self) -> str:
        return f"TLS certificate {self.cert} ({self.how}), SHA-256 fingerprint {self.fingerprint}"


def fingerprint(cert: x509.Certificate) -> str:
    return cert.fingerprint(hashes.SHA256()).hex(":").upper()


def host_name(value: str) -> str:
    """The name in a Host header value or --allowed-host pattern: ``NAME``, ``NAME:PORT``,
    ``NAME:*``, ``[V6]`` or ``[V6]:PORT``."""
    if value.startswith("["):
        return value[1 : value.find("]")] if "]" in value else value[1:]
    name, sep, port = value.rpartition(":")
    return name if sep and (port == "*" or port.isdigit()) and ":" not in name else value


def cert_names(host: str, allowed_hosts: list[str]) -> list[str]:
    """The names a made certificate carries: the ones the Host check accepts (the bind address
    unless it is a wildcard, the localhost forms, --allowed-host's names), normalised, sorted."""
    names = set(LOOPBACK_NAMES)
    if host not in WILDCARD_BINDS:
        names.add(host)
    names.update(host_name(h) for h in allowed_hosts)
    out = set()
    for name in names:
        try:
            out.add(str(ipaddress.ip_address(name)))
        except ValueError:
            out.add(name.lower().rstrip("."))
    return sorted(n for n in out if n)


DNS_NAME = re.compile(r"^(?=.{1,253}$)[a-z0-9_]([a-z0-9_-]{0,62})(\.[a-z0-9_]([a-z0-9_-]{0,62}))*$")


def _sans(names: list[str]) -> list[x509.GeneralName]:
    sans: list[x509.GeneralName] = []
    for name in names:
        try:
            sans.append(x509.IPAddress(ipaddress.ip_address(name)))
        except ValueError:
            # A certificate names hosts in ASCII DNS form only; anything else is refused here
            # in one line rather than by the certificate library in a traceback.
            if not DNS_NAME.match(name):
                raise StartRefused(
                    f"--tls self-signed: {name!r} (from --host or --allowed-host) is not a host name "
                    "a certificate can carry (ASCII letters, digits, '-', '.')"
                ) from None
            sans.append(x509.DNSName(name))
    return sans


def _cert_san_names(cert: x509.Certificate) -> list[str]:
    try:
        ext = cert.extensions.get_extension_for_class(x509.SubjectAlternativeName).value
    except x509.ExtensionNotFound:
        return []
    ips = [str(ip) for ip in ext.get_values_for_type(x509.IPAddress)]
    return sorted(ips + list(ext.get_values_for_type(x509.DNSName)))


def _private_file(path: Path) -> bool:
    """``path`` is a regular file (not a symlink) of ours that no one else can read."""
    try:
        st = os.lstat(path)
    except OSError:
        return False
    return stat.S_ISREG(st.st_mode) and st.st_uid == os.geteuid() and not st.st_mode & 0o077


def _reusable(cert_path: Path, key_path: Path, names: list[str], now: datetime.datetime) -> Tls | None:
    """The made certificate in the state folder, when it still fits: its names are ``names``,
    it has more than CERT_RENEW_DAYS left, and the key beside it is private and its own."""
    if not (_private_file(key_path) and _private_file(cert_path)):
        return None
    try:
        cert = x509.load_pem_x509_certificate(cert_path.read_bytes())
        key = serialization.load_pem_private_key(key_path.read_bytes(), password=None)
    except (OSError, ValueError, TypeError):
        return None
    if _cert_san_names(cert) != names:
        return None
    if cert.not_valid_after_utc - now < datetime.timedelta(days=CERT_RENEW_DAYS):
        return None
    if cert.not_valid_before_utc > now:
        return None
    spki = (serialization.Encoding.DER, serialization.PublicFormat.SubjectPublicKeyInfo)
    if cert.public_key().public_bytes(*spki) != key.public_key().public_bytes(*spki):
        return None
    return Tls(cert_path, key_path, fingerprint(cert), "reused")


def _write_private(path: Path, data: bytes) -> None:
    """``data`` into ``path``, replaced whole: a new 0600 file beside it, renamed over it."""
    tmp = path.with_name(f".{path.name}.{secrets.token_hex(8)}")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600)
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(data)
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(OSError):
            tmp.unlink()
        raise


def self_signed(state_dir: Path, names: list[str], now: datetime.datetime | None = None) -> Tls:
    """A self-signed certificate for ``names`` (EC P-256) in ``state_dir`` (0700, ours): the one
    there while it fits (_reusable), else a new one."""
    now = now or datetime.datetime.now(datetime.UTC)
    try:
        private_dir(state_dir, "TLS state directory")
    except UnsafeLockDir as exc:
        raise StartRefused(str(exc)) from None
    cert_path, key_path = state_dir / "cert.pem", state_dir / "key.pem"
    found = _reusable(cert_path, key_path, names, now)
    if found is not None:
        return found
    key = ec.generate_private_key(ec.SECP256R1())
    subject = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "gemma-rig MCP server")])
    public = key.public_key()
    cert = (
        x509.CertificateBuilder()
        .subject_name(subject)
        .issuer_name(subject)
        .public_key(public)
        .serial_number(x509.random_serial_number())
        # A few minutes back: a client whose clock is a little behind still accepts it.
        .not_valid_before(now - datetime.timedelta(minutes=5))
        .not_valid_after(now + datetime.timedelta(days=CERT_DAYS))
        .add_extension(x509.SubjectAlternativeName(_sans(names)), critical=False)
        # A server certificate only (never a CA that could vouch for another name), which
        # OpenSSL's strict checks (Python 3.13's default context) accept as its own trust anchor.
        .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
        .add_extension(
            x509.KeyUsage(
                digital_signature=True,
                content_commitment=False,
                key_encipherment=False,
                data_encipherment=False,
                key_agreement=False,
                key_cert_sign=False,
                crl_sign=False,
                encipher_only=False,
                decipher_only=False,
            ),
            critical=True,
        )
        .add_extension(x509.ExtendedKeyUsage([ExtendedKeyUsageOID.SERVER_AUTH]), critical=False)
        .add_extension(x509.SubjectKeyIdentifier.from_public_key(public), critical=False)
        .add_extension(x509.AuthorityKeyIdentifier.from_issuer_public_key(public), critical=False)
        .sign(key, hashes.SHA256())
    )
    # The key first: a start cut short in between leaves a pair that does not match, which the
    # next start makes again rather than serves.
    _write_private(
        key_path,
        key.private_bytes(
            serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()
        ),
    )
    _write_private(cert_path, cert.public_bytes(serialization.Encoding.PEM))
    return Tls(cert_path, key_path, fingerprint(cert), "made")


def given_tls(cert_path: Path, key_path: Path, now: datetime.datetime | None = None) -> Tls:
    """The operator's certificate and key, checked now rather than on the first client: the key
    readable by this user alone, the pair loads and matches, the certificate is in its dates."""
    now = now or datetime.datetime.now(datetime.UTC)
    try:
        st = os.stat(key_path)
    except OSError as exc:
        raise StartRefused(f"--tls-key {key_path}: {exc.strerror}") from None
    if not stat.S_ISREG(st.st_mode):
        raise StartRefused(f"--tls-key {key_path} is not a regular file")
    if st.st_mode & 0o077:
        raise StartRefused(
            f"--tls-key {key_path} is readable by others (mode {stat.S_IMODE(st.st_mode):04o}): chmod 600 it"
        )
    try:
        ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER).load_cert_chain(cert_path, key_path)
        cert = x509.load_pem_x509_certificate(Path(cert_path).read_bytes())
    except (OSError, ssl.SSLError, ValueError) as exc:
        reason = getattr(exc, "strerror", None) or getattr(exc, "reason", None) or str(exc)
        raise StartRefused(
            f"--tls-cert {cert_path} with --tls-key {key_path} cannot serve TLS: {reason}"
        ) from None
    if not cert.not_valid_before_utc <= now <= cert.not_valid_after_utc:
        raise StartRefused(
            f"--tls-cert {cert_path} is valid from {cert.not_valid_before_utc:%Y-%m-%d} to "
            f"{cert.not_valid_after_utc:%Y-%m-%d}, not now"
        )
    return Tls(Path(cert_path), Path(key_path), fingerprint(cert), "given")


def default_tls_dir() -> Path:
    return Path.home() / ".cache" / "gemma-rig" / "mcp-tls"


def http_tls(
    host: str,
    port: int,
    cert: Path | None,
    key: Path | None,
    mode: str | None,
    allowed_hosts: list[str],
    state_dir: Path | None = None,
) -> Tls | None:
    """The TLS the server speaks, or None (plain HTTP, on loopback only); StartRefused off
    loopback with neither a certificate nor --tls self-signed."""
    if (cert is None) != (key is None):
        raise StartRefused("--tls-cert and --tls-key go together: give both")
    if cert is not None and key is not None:
        if mode == "self-signed":
            raise StartRefused("--tls self-signed or --tls-cert/--tls-key: give one or the other")
        return given_tls(cert, key)
    if mode == "self-signed":
        return self_signed(state_dir or default_tls_dir(), cert_names(host, allowed_hosts))
    if is_loopback(host):
        return None
    raise StartRefused(
        f"--host {host} is not loopback and the token and prompts would cross the network in clear "
        f"text: give --tls-cert FILE --tls-key FILE, or --tls self-signed, or serve on loopback and "
        f"reach it through an SSH tunnel (ssh -N -L {port}:127.0.0.1:{port} CONTROLLER)"
    )


def http_security(
    host: str, extra_hosts: list[str], extra_origins: list[str], tls: bool = False
) -> TransportSecuritySettings:
    """Host and Origin checks (DNS rebinding): the bind address and the localhost forms, any port,
    plus what --allowed-host / --allowed-origin add; origins in the scheme the server speaks."""
    names = [f"[{host}]" if ":" in host else host, "127.0.0.1", "localhost", "[::1]"]
    names = list(dict.fromkeys(names))
    scheme = "https" if tls else "http"
    return TransportSecuritySettings(
        enable_dns_rebinding_protection=True,
        allowed_hosts=[f"{n}:*" for n in names] + list(extra_hosts),
        allowed_origins=[f"{scheme}://{n}:*" for n in names] + list(extra_origins),
    )


async def serve(mcp: Any, host: str, port: int, security: TransportSecuritySettings, tls: Tls | None) -> None:
    """The SDK's streamable HTTP app on uvicorn (what MCPServer.run does), with TLS when given:
    the SDK's run() has no way to pass a certificate to uvicorn."""
    import uvicorn

    if mcp.settings.auth is None:  # main() never gets here without a token; nor may anyone else
        raise StartRefused("the HTTP transport is never served without a bearer token")
    app = mcp.streamable_http_app(transport_security=security, host=host)
    options: dict[str, Any] = {}
    if tls is not None:
        options = {"ssl_certfile": str(tls.cert), "ssl_keyfile": str(tls.key)}
    config = uvicorn.Config(app, host=host, port=port, log_level=mcp.settings.log_level.lower(), **options)
    await uvicorn.Server(config).serve()


def say(line: str) -> None:
    print(f"rig_mcp: {line}", file=sys.stderr, flush=True)
