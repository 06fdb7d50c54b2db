"""Stand-ins for a fast tokenizer backend that is wrong (a third-party library's bug): fastokens,
but one id off on the texts a predicate picks, to test the gate and the audit."""

from __future__ import annotations

import re
import time
import uuid

import numpy as np

from input_server.data.tokenizers.backends import PROBES
from input_server.data.tokenizers.groups import framed
from input_server.data.tokenizers.tiktoken import TiktokenTokenizer


class SkewedBackend:
    """fastokens, but the first id of each text that `wrong` picks is one more."""

    name = "fastokens"

    def __init__(self, real, version: str, wrong):
        self.real, self.version, self.wrong = real, version, wrong

    def encode(self, texts: list[str]) -> list[np.ndarray]:
        out = []
        for ids, text in zip(self.real.encode(texts), texts, strict=True):
            if len(ids) and self.wrong(text):
                ids = ids.copy()
                ids[0] += 1
            out.append(ids)
        return out

    def encode_framed(
        self, texts: list[str], head: list[int], tail: list[int]
    ) -> tuple[np.ndarray, np.ndarray]:
        ids = self.encode(texts)
        offsets = np.zeros(len(ids) + 1, np.int64)
        np.cumsum([len(x) for x in ids], out=offsets[1:])
        flat = np.concatenate(ids) if ids else np.zeros(0, np.int32)
        return framed(flat.astype(np.int32, copy=False), offsets, head, tail)


class SleepyBackend:
    """A backend that is exact but slow: the real one, sleeping `delay_s` a call first (no CPU:
    its caller waits)."""

    def __init__(self, real, delay_s: float):
        self.real, self.delay = real, [delay_s]  # a list: a test may change it while it serves
        self.name, self.version = real.name, real.version

    @property
    def delay_s(self) -> float:
        return self.delay[0]

    def encode(self, texts: list[str]) -> list[np.ndarray]:
        time.sleep(self.delay_s)
        return self.real.encode(texts)

    def encode_framed(
        self, texts: list[str], head: list[int], tail: list[int]
    ) -> tuple[np.ndarray, np.ndarray]:
        time.sleep(self.delay_s)
        return self.real.encode_framed(texts, head, tail)


def sleepy_kind(base: type, delay_s: float) -> type:
    """`base` (a tokenizer kind) whose fast backends are `SleepyBackend`s."""

    class Sleepy(base):
        def load_backend(self, name):
            return SleepyBackend(super().load_backend(name), delay_s)

    return Sleepy


def skewed_kind(wrong, version: str) -> type[TiktokenTokenizer]:
    class Skewed(TiktokenTokenizer):
        def load_backend(self, name):
            return SkewedBackend(super().load_backend(name), version, wrong)

    return Skewed


def own_version() -> str:
    """A version of its own per test: the gate remembers verdicts by version."""
    return f"test-{uuid.uuid4().hex}"


def first_new_word(texts: list[str], start: int) -> tuple[str, int]:
    """A word (and the first document holding it) found in no document before `start` and in
    no probe: a backend wrong only on it passes the gate on the first documents."""
    seen = "\0".join([*texts[:start], *PROBES])
    for i in range(start, len(texts)):
        for word in re.findall(r"[A-Za-z]{6,}", texts[i]):
            if word not in seen:
                return word, i
    raise AssertionError(f"every word after document {start} appears before it")
