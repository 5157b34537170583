"""What a server listens on: a bound socket and, for ``wss://``, a TLS context.

Both are made before anything else at start-up (``mycelia serve`` binds the port before
it creates anything on disk), and an operator's mistake — a port in use, an address this
machine does not have, a missing or unreadable certificate — is a one-line
:class:`~mycelia.errors.ConfigError` that says what to do, never a traceback.
"""

from __future__ import annotations

import errno
import ipaddress
import os
import socket
import ssl

from mycelia.errors import AddressInUse, ConfigError

__all__ = ["bind", "is_loopback", "server_tls"]


def bind(host: str, port: int) -> socket.socket:
    """A TCP socket bound to ``host:port`` and listening (``port=0`` picks a free one).

    Raises:
        AddressInUse: another process listens there.
        ConfigError: the address cannot be used here (unknown name, not this machine's,
            a privileged port).
    """
    if not 0 <= port <= 65535:
        raise ConfigError(f"port {port} is not a TCP port (0-65535; 0 picks a free one)")
    try:
        family = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM)[0][0]
    except socket.gaierror as exc:
        raise ConfigError(f"cannot listen on {host!r}: {exc.strerror}") from exc
    try:
        return socket.create_server((host, port), family=family, backlog=512)
    except OSError as exc:
        if exc.errno == errno.EADDRINUSE:
            raise AddressInUse(
                f"{host}:{port} is in use (another server?): stop it or choose another --port"
            ) from exc
        if exc.errno in (errno.EACCES, errno.EPERM):
            raise ConfigError(
                f"no permission to listen on {host}:{port}: use a port above 1023"
            ) from exc
        raise ConfigError(f"cannot listen on {host}:{port}: {exc.strerror}") from exc


def is_loopback(host: str) -> bool:
    """Whether ``host`` only reaches this machine (``localhost``, 127.0.0.0/8, ``::1``)."""
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host.strip("[]")).is_loopback
    except ValueError:
        return False  # a name other than localhost may resolve anywhere


def server_tls(
    cert_file: str | os.PathLike[str], key_file: str | os.PathLike[str]
) -> ssl.SSLContext:
    """A server TLS context from a PEM certificate chain and its private key.

    Raises ConfigError if either file is missing or unreadable, or they do not match.
    """
    for what, path in (("certificate", cert_file), ("key", key_file)):
        if not os.path.isfile(path):
            raise ConfigError(f"the TLS {what} file {path} does not exist")
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    context.minimum_version = ssl.TLSVersion.TLSv1_2
    try:
        context.load_cert_chain(cert_file, key_file)
    except ssl.SSLError as exc:
        raise ConfigError(
            f"cannot use TLS certificate {cert_file} with key {key_file}: {exc.reason or exc} "
            "(both PEM; the key must belong to the certificate)"
        ) from exc
    except OSError as exc:
        raise ConfigError(f"cannot read the TLS files: {exc.strerror}") from exc
    return context
