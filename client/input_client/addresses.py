"""Where a server listens when given no address (the client's default too), and what a client
can tell about an address before dialing it.

The client owns this: `input-server serve` takes its default from here, so the two can never
disagree, and the client distribution never imports the server.
"""

from __future__ import annotations

import contextlib
import os
import stat
import tempfile

# The name clients of earlier releases dial in $XDG_RUNTIME_DIR.
SOCKET_NAME = f"input-server-{os.geteuid()}.sock"


def _is_private_dir(st: os.stat_result) -> bool:
    return stat.S_ISDIR(st.st_mode) and st.st_uid == os.geteuid() and not st.st_mode & 0o077


def default_socket_dir() -> str:
    """$XDG_RUNTIME_DIR when it is ours and private (systemd makes it so), else
    `$TMPDIR/input-server-UID` (the server makes it private).

    An XDG_RUNTIME_DIR that is not ours is passed over, not refused: `sudo -s` keeps the
    invoking user's, and root's server belongs in root's folder.
    """
    xdg = os.environ.get("XDG_RUNTIME_DIR")
    if xdg:
        with contextlib.suppress(OSError):
            if _is_private_dir(os.stat(xdg)):
                return xdg
    return os.path.join(tempfile.gettempdir(), f"input-server-{os.geteuid()}")


def default_socket_paths() -> list[str]:
    """Where a plain `serve` of this user may listen, whatever its environment: this
    process's $XDG_RUNTIME_DIR, systemd's /run/user/UID (what a login shell has and cron, tmux or an
    IDE may not), and `input-server-UID` in $TMPDIR and in /tmp. Folders that are not ours
    and private are left out: a socket there may be anyone's."""
    folders = [os.environ.get("XDG_RUNTIME_DIR"), f"/run/user/{os.geteuid()}"]
    paths = []
    for folder in filter(None, folders):
        with contextlib.suppress(OSError, ValueError):  # ValueError: a NUL in the variable
            if _is_private_dir(os.stat(folder)):
                paths.append(os.path.join(folder, SOCKET_NAME))
    for tmp in (tempfile.gettempdir(), "/tmp"):
        folder = os.path.join(tmp, f"input-server-{os.geteuid()}")
        if os.path.lexists(folder) and folder_problem(folder) is None:
            paths.append(os.path.join(folder, SOCKET_NAME))
    return list(dict.fromkeys(os.path.abspath(p) for p in paths))


def servers_elsewhere(path: str) -> list[str]:
    """For a default socket path `path` (a `serve` of some environment's default), the other
    default socket paths (`default_socket_paths`) where a server answers now: where the
    server a client misses may be (started with another XDG_RUNTIME_DIR or TMPDIR). Empty
    for a path a user chose: a default server is no answer to it."""
    if os.path.basename(path) != SOCKET_NAME:
        return []
    here = os.path.realpath(path)
    return [p for p in default_socket_paths() if os.path.realpath(p) != here and answers(p)]


def default_socket() -> str:
    """The address a plain `input-server serve` listens on, and `InputClient()` dials."""
    return f"unix://{os.path.join(default_socket_dir(), SOCKET_NAME)}"


def folder_problem(path: str) -> str | None:
    """What makes the folder at `path` unsafe for the default socket (None: it is missing, or
    ours and 0700). In a world-writable /tmp another user could have made it first, to reach
    or replace the socket, or to pose as our server."""
    try:
        st = os.lstat(path)  # a link is refused, not followed: whoever made it chose its target
    except FileNotFoundError:
        return None
    if stat.S_ISLNK(st.st_mode) or not stat.S_ISDIR(st.st_mode):
        return "is not a folder"
    if st.st_uid != os.geteuid():
        return f"belongs to uid {st.st_uid}, not to you (uid {os.geteuid()})"
    if st.st_mode & 0o077:
        return (
            f"has mode {stat.S_IMODE(st.st_mode):04o}, so other users can reach the "
            f"socket; it must be 0700 (chmod 700 {path})"
        )
    return None


def check_private_dir(path: str) -> None:
    """Raises PermissionError, one line naming the folder and what is wrong with it, when the
    folder at `path` exists and is not ours alone (`folder_problem`)."""
    problem = folder_problem(path)
    if problem:
        raise PermissionError(
            f"the default socket's folder {path} {problem}; fix or remove it, "
            f"or name a socket elsewhere (serve --listen unix:///PATH.sock)"
        )


def socket_path(address: str) -> str | None:
    """The file a `unix:` target names (`unix:///abs`, `unix:/abs`, `unix:relative`), else
    None (TCP, `unix-abstract:`, other schemes)."""
    if not address.startswith("unix:"):
        return None
    rest = address[len("unix:") :]
    return rest[2:] if rest.startswith("//") else rest


def looks_like_a_path(address: str) -> bool:
    """A target without a scheme that names a file, not a host: gRPC would resolve it as a DNS
    name and wait for ever."""
    return ":" not in address.split("/", 1)[0] and ("/" in address or address.endswith(".sock"))


def is_socket(path: str) -> bool:
    try:
        return stat.S_ISSOCK(os.stat(path).st_mode)
    except OSError:
        return False


def answers(path: str) -> bool:
    """Whether something accepts connections on the socket file at `path` now."""
    return is_socket(path) and _connect(path, timeout_s=0.5) is None


def nobody_answers(path: str, *, timeout_s: float = 1.0) -> bool:
    """Whether the socket file at `path` refuses connections: left by a server that stopped
    without removing it (killed), or one that has bound it and not yet started. A listener
    too busy to accept within `timeout_s` answers (it is not refusing)."""
    return isinstance(_connect(path, timeout_s=timeout_s), ConnectionRefusedError)


def _connect(path: str, *, timeout_s: float) -> OSError | None:
    """Connects to the socket file at `path` and hangs up: None if something accepted the
    connection, else why not (refused: a socket nobody listens on; timed out: a listener too
    busy to accept; not found, not a socket, ...)."""
    import socket

    probe = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    probe.settimeout(timeout_s)
    try:
        probe.connect(path)
    except OSError as e:
        return e
    finally:
        probe.close()
    return None
