"""Shared fixtures: a real-text corpus, a sentencepiece model trained on it, a running server."""

from __future__ import annotations

import os
import pathlib

# Eight CPU devices for sharding tests; must be set before jax is first imported.
os.environ.setdefault("XLA_FLAGS", "--xla_force_host_platform_device_count=8")

import pytest  # noqa: E402

from input_client import InputClient, PipelineSpec  # noqa: E402
from input_server.batching.grain_adapter import ensure_absl_flags_parsed  # noqa: E402
from input_server.data.builtin_corpora import stdlib_docstrings, write_jsonl  # noqa: E402
from input_server.data.tokenizers.trainers import train_sentencepiece  # noqa: E402

ensure_absl_flags_parsed()  # pytest parses no absl flags

NUM_DOCS = 1500


@pytest.fixture(scope="session", autouse=True)
def _in_basetemp(tmp_path_factory):
    """Tests run in pytest's temporary root, which holds every test's data: a server started
    without `--data-root` reads from its working directory only (the security default)."""
    before = os.getcwd()
    os.chdir(tmp_path_factory.getbasetemp())
    yield
    os.chdir(before)


def pytest_collection_modifyitems(session, config, items):
    """The long tests first (system, then integration, then unit; the order within each kept):
    the workers that finish early take the rest of the long ones (xdist's work stealing), and
    short tests fill the gaps at the end."""
    rank = {"system": 0, "integration": 1}
    items.sort(key=lambda item: rank.get(pathlib.Path(str(item.path)).parent.name, 2))


@pytest.hookimpl(hookwrapper=True, tryfirst=True)
def pytest_runtest_protocol(item, nextitem):
    """Tests run in parallel (pytest-xdist), but one marked `alone` runs with no other test
    beside it: it measures time or load, which another test's work would move. The share is
    taken around the whole protocol (the fixtures a test sets up included) and outside
    pytest-timeout's timer, so waiting for it counts against no test's time limit."""
    from tests.support import machine_share, run_dir

    if getattr(item.config, "workerinput", None) is None:  # one process: nothing runs beside
        yield
        return
    alone = item.get_closest_marker("alone") is not None
    with machine_share(run_dir(item.config), alone=alone):
        yield


@pytest.fixture
def short_tmp():
    """A new folder with a short path (/tmp/is-XXXXXXXX), for a default Unix socket inside it:
    a socket path holds at most 107 bytes, and pytest-xdist's tmp_path can leave too few."""
    import shutil
    import tempfile

    folder = tempfile.mkdtemp(prefix="is-", dir="/tmp")
    yield pathlib.Path(folder)
    shutil.rmtree(folder, ignore_errors=True)


@pytest.fixture(scope="session")
def docs() -> list[str]:
    """Real English: the standard library's docstrings (offline, the same on every machine)."""
    return stdlib_docstrings(NUM_DOCS)


@pytest.fixture(scope="session")
def some_docs(docs) -> list[str]:
    """The first 300 documents, for the file-format tests: ~50 batches, fast to tokenize."""
    return docs[:300]


@pytest.fixture(scope="session")
def data_dir(tmp_path_factory) -> str:
    return str(tmp_path_factory.mktemp("data"))


@pytest.fixture(scope="session")
def corpus(docs, data_dir) -> str:
    """The documents as plain jsonl."""
    return write_jsonl(docs, os.path.join(data_dir, "corpus.jsonl"))


@pytest.fixture(scope="session")
def spm_model(docs, data_dir) -> str:
    """A real unigram sentencepiece model (vocab 1000, pad 0, bos 1, eos 2) trained on `docs`."""
    return train_sentencepiece(docs, os.path.join(data_dir, "spm"), vocab_size=1000)


@pytest.fixture(scope="session")
def make_spec(corpus, spm_model):
    """Small specs over the corpus: `make_spec(batch={"size": 2}, source={...})`."""

    def make(**tables) -> PipelineSpec:
        base = PipelineSpec(
            source={"paths": [corpus]},
            tokenizer={"model": spm_model},
            batch={"seq_len": 128, "size": 4},
            workers={"count": 0},
        )
        return base.replace(**tables) if tables else base

    return make


@pytest.fixture(scope="session")
def server(tmp_path_factory):
    """One real server for the session, on a Unix socket and a loopback TCP port; the TCP port
    needs the token in `tests.support.TOKENS` (the Unix socket's file mode is its guard)."""
    from input_server.serving.server import Server, ServerConfig
    from tests.support import TOKENS, write_token_file

    sock = tmp_path_factory.mktemp("sock") / "input.sock"
    token_file, token = write_token_file(tmp_path_factory.mktemp("token"))
    with Server(
        ServerConfig(listen=[f"unix://{sock}", "127.0.0.1:0"], token_file=token_file)
    ) as srv:
        TOKENS[srv.targets[1]] = token
        yield srv
        TOKENS.pop(srv.targets[1], None)


@pytest.fixture(params=["unix", "tcp"])
def target(request, server) -> str:
    """The server's Unix-socket target, then its TCP target (whose token is in `TOKENS`)."""
    return server.targets[0 if request.param == "unix" else 1]


@pytest.fixture
def client(target):
    from tests.support import TOKENS

    with InputClient(target, connect_timeout_s=10, token=TOKENS.get(target)) as c:
        yield c
