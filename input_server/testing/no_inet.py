"""A host that refuses TCP and UDP, as the TPU hosts this project serves do (gVisor, Unix sockets
only): a seccomp filter makes `socket(AF_INET | AF_INET6, ...)` fail with EAFNOSUPPORT ("Address
family not supported by protocol", errno 97) in this process and every process it starts, gRPC's
C core included (a Python monkeypatch of `socket.socket` would not reach it).

`python -m input_server.testing.no_inet COMMAND [ARGS...]` installs the filter and execs the
command. Linux on x86-64 or arm64 only; `refuse_inet()` raises `Unavailable` with the reason
elsewhere. The filter is plain classic BPF loaded with prctl (no libseccomp): it needs no
privilege, since it sets no_new_privs first.
"""

from __future__ import annotations

import ctypes
import errno
import os
import platform
import socket
import struct
import sys

# linux/audit.h, linux/seccomp.h, linux/filter.h, linux/prctl.h.
_AUDIT_ARCH = {"x86_64": 0xC000003E, "aarch64": 0xC00000B7}
_SOCKET_NR = {"x86_64": 41, "aarch64": 198}  # socket(2)
_X32_SYSCALL_BIT = 0x40000000  # x86-64's x32 ABI numbers: refused whole (nothing here uses it)
_PR_SET_NO_NEW_PRIVS = 38
_PR_SET_SECCOMP = 22
_SECCOMP_MODE_FILTER = 2
_RET_ALLOW = 0x7FFF0000
_RET_ERRNO = 0x00050000
_RET_KILL = 0x00000000
# struct seccomp_data: int nr; __u32 arch; __u64 instruction_pointer; __u64 args[6].
_NR, _ARCH, _ARG0 = 0, 4, 16  # args[0]'s low 32 bits on a little-endian host
# BPF opcodes: BPF_LD|BPF_W|BPF_ABS, BPF_JMP|BPF_JEQ|BPF_K, BPF_JMP|BPF_JGE|BPF_K, BPF_RET|BPF_K.
_LD, _JEQ, _JGE, _RET = 0x20, 0x15, 0x35, 0x06


class Unavailable(Exception):
    """The filter cannot be installed here (the message says why)."""


class _Filter(ctypes.Structure):
    _fields_ = [("len", ctypes.c_ushort), ("filter", ctypes.c_void_p)]


def _program(machine: str) -> bytes:
    """The filter: another architecture's calls are killed (their numbers mean other calls);
    socket(AF_INET or AF_INET6, ...) gets EAFNOSUPPORT; everything else is allowed."""
    refused = _RET_ERRNO | errno.EAFNOSUPPORT
    steps = [
        (_LD, 0, 0, _ARCH),
        (_JEQ, 1, 0, _AUDIT_ARCH[machine]),
        (_RET, 0, 0, _RET_KILL),
        (_LD, 0, 0, _NR),
        (_JGE, 5, 0, _X32_SYSCALL_BIT),
        (_JEQ, 0, 3, _SOCKET_NR[machine]),
        (_LD, 0, 0, _ARG0),
        (_JEQ, 2, 0, socket.AF_INET),
        (_JEQ, 1, 0, socket.AF_INET6),
        (_RET, 0, 0, _RET_ALLOW),
        (_RET, 0, 0, refused),
    ]
    return b"".join(struct.pack("=HBBI", *s) for s in steps)


def refuse_inet() -> None:
    """From now on this process and its children get EAFNOSUPPORT for every IPv4 or IPv6
    socket; Unix sockets and everything else work as before. It cannot be undone.

    Raises:
      Unavailable: not Linux on x86-64 or arm64, or the kernel refused the filter.
    """
    machine = platform.machine()
    if sys.platform != "linux" or machine not in _SOCKET_NR:
        raise Unavailable(f"seccomp filters here need Linux on x86-64 or arm64, not {machine}")
    code = _program(machine)
    buffer = ctypes.create_string_buffer(code, len(code))
    prog = _Filter(len(code) // 8, ctypes.addressof(buffer))
    libc = ctypes.CDLL(None, use_errno=True)
    # prctl takes five arguments whatever the option; the unused ones must be zero.
    libc.prctl.argtypes = [ctypes.c_int] + [ctypes.c_ulong] * 4
    if libc.prctl(_PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0) != 0:
        raise Unavailable(f"prctl(PR_SET_NO_NEW_PRIVS): {os.strerror(ctypes.get_errno())}")
    if libc.prctl(_PR_SET_SECCOMP, _SECCOMP_MODE_FILTER, ctypes.addressof(prog), 0, 0) != 0:
        raise Unavailable(f"prctl(PR_SET_SECCOMP): {os.strerror(ctypes.get_errno())}")


def argv(*command: str) -> list[str]:
    """`command` run under the filter by this interpreter (`command` itself is exec'd as is)."""
    return [sys.executable, "-m", "input_server.testing.no_inet", *command]


def main(args: list[str]) -> int:
    if not args:
        print("usage: python -m input_server.testing.no_inet COMMAND [ARGS...]", file=sys.stderr)
        return 2
    try:
        refuse_inet()
    except Unavailable as e:
        print(f"no_inet: {e}", file=sys.stderr)
        return 3
    try:
        os.execvp(args[0], args)
    except OSError as e:
        print(f"no_inet: cannot run {args[0]}: {e.strerror}", file=sys.stderr)
        return 127


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
