"""A socket file's lock (`serving/socket_lock.py`): one holder, whatever the path's spelling,
dropped when its holder lets go, and not kept by a child the holder forks."""

from __future__ import annotations

import os

from input_server.serving.socket_lock import SocketLock, take_all


def test_one_holder_whatever_the_spelling(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    held = SocketLock(str(tmp_path / "s.sock"))
    assert held.take() and held.held
    assert not SocketLock("s.sock").take()  # relative: the same file
    held.release()
    again = SocketLock("s.sock")
    assert again.take()
    again.release()
    assert (tmp_path / "s.sock.lock").exists()  # kept: a waiter may hold its inode


def test_a_forked_child_does_not_keep_its_parents_lock(tmp_path):
    lock = SocketLock(str(tmp_path / "s.sock"))
    assert lock.take()
    read, write = os.pipe()
    ready_r, ready_w = os.pipe()
    pid = os.fork()
    if pid == 0:  # the child (its fork hooks have run): says so, waits for the parent, lives on
        os.write(ready_w, b"x")
        os.read(read, 1)
        os._exit(0)
    os.read(ready_r, 1)
    try:
        lock.release()
        other = SocketLock(str(tmp_path / "s.sock"))
        assert other.take(), "the forked child still holds the lock its parent let go"
        other.release()
    finally:
        os.write(write, b"x")
        for fd in (read, write, ready_r, ready_w):
            os.close(fd)
        os.waitpid(pid, 0)


def test_a_standby_takes_every_lock_or_none(tmp_path):
    a, b = (SocketLock(str(tmp_path / n)) for n in ("a.sock", "b.sock"))
    other = SocketLock(str(tmp_path / "b.sock"))
    assert other.take()
    assert not take_all([a, b])
    assert not a.held  # given back: another standby listing b first may take both
    other.release()
    assert take_all([a, b]) and a.held and b.held
