"""Files and folders only this server's user may write: the operator's caches (the token
cache, the tokenizer cache), whose contents are served to training as if computed here, so a
file another user planted or may change is never read from them."""

from __future__ import annotations

import os


def not_own(st: os.stat_result) -> str | None:
    """Why the file or folder `st` describes is not this server's user's alone, or None."""
    if st.st_uid != os.geteuid():
        return f"belongs to user {st.st_uid}, not to this server's ({os.geteuid()})"
    if st.st_mode & 0o022:
        return f"has mode {st.st_mode & 0o777:o}: others can write into it"
    return None


def check_own_folder(folder: str, name: str) -> None:
    """Refuses (ValueError naming `name`, e.g. the flag) a folder that is not this server's
    user's alone.

    Raises:
      OSError: the folder cannot be read.
    """
    why = not_own(os.stat(folder))
    if why is not None:
        raise ValueError(f"{name} {folder!r} {why}; give a folder of its own, or `chmod go-w` it.")
