"""The server's socket, bound before anything loads.

Loading a model and starting the engine take seconds to minutes; a port that is already taken
must fail before that, in a second, not after. So `tram serve` binds its socket first (as uvicorn
would: SO_REUSEADDR, IPv6 for a host with a colon) and hands that very socket to uvicorn, which
starts listening on it once the engine is up; nothing can take the port in between. Until then
connections are refused, as they would be with no server at all. Torch-free and cheap to import.
"""

from __future__ import annotations

import errno
import socket


class PortUnavailableError(SystemExit):
    """The address cannot be bound; the message is the one line the user sees (exit status 1)."""


def server_url(host: str, port: int, tls: bool = False) -> str:
    shown = f"[{host}]" if ":" in host else host
    return f"{'https' if tls else 'http'}://{shown}:{port}"


def bind_socket(host: str, port: int) -> socket.socket:
    """A TCP socket bound to host:port, not yet listening; PortUnavailableError if that fails."""
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    try:
        sock.bind((host, port))
    except socket.gaierror as e:  # an unknown host name (a subclass of OSError)
        sock.close()
        raise PortUnavailableError(f"error: cannot listen on {host}:{port}: {e.strerror}") from None
    except OSError as e:
        sock.close()
        if e.errno == errno.EADDRINUSE:
            reason = "the port is already in use (another server?); stop it or choose another --port"
        elif e.errno == errno.EACCES:
            reason = "permission denied (ports below 1024 need privileges); choose another --port"
        else:
            reason = e.strerror or str(e)
        raise PortUnavailableError(f"error: cannot listen on {host}:{port}: {reason}") from None
    return sock
