"""Which packages and requirements the input-server distribution has.

See scripts/tools/packaging/input_server_build.py: a built wheel is the server alone and requires
`input-client` by name; an editable install is the whole checkout, both packages from the tree.
"""

import os
import pathlib
import re
import tomllib

from setuptools import find_packages, setup

ROOT = pathlib.Path(__file__).resolve().parent
CLIENT = tomllib.loads((ROOT / "client" / "pyproject.toml").read_text())["project"]
SERVER = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
# One release of both: the server requires the client of its own version, and reports it.
REPORTED = re.search(
    r'__version__ = "([^"]+)"', (ROOT / "input_server" / "version.py").read_text()
).group(1)
if not CLIENT["version"] == SERVER["version"] == REPORTED:
    raise SystemExit(
        f"versions differ: client/pyproject.toml {CLIENT['version']}, "
        f"pyproject.toml {SERVER['version']}, input_server/version.py "
        f"{REPORTED}; release them together."
    )

SERVER_REQUIRES = [
    # batching/grain_adapter.py reads Grain internals (worker processes), checked against
    # 0.2.18; the newest Grain for Python 3.10 (0.2.13) lays them out otherwise, hence Python
    # 3.11 at least.
    "grain>=0.2.18",
    "sentencepiece>=0.2.3",  # encode(return_type="numpy"), GIL released in encode
    "tokenizers>=0.20",  # tokenizer.kind "huggingface": encode_batch_fast releases the GIL
    "tiktoken>=0.8",  # tokenizer.kind "tiktoken": encode_to_tiktoken_buffer (numpy, no lists)
    # Fast backends, each serving only behind the exactness gate (tokenizers/backends.py):
    "fastokens>=0.3.5",  # tiktoken ranks and byte-level BPE tokenizer.json; encode_batch_flat
    "kitoken>=0.11",  # sentencepiece models
    "grpcio-health-checking>=1.66",
    # `grpcurl -unix -plaintext SOCKET list`: server reflection (its v1alpha service, which
    # grpcurl and grpc_cli ask first).
    "grpcio-reflection>=1.66",
    # `serve --metrics-port`: a custom collector on a registry of its own (`Collector` in
    # prometheus_client.registry, and `make_wsgi_app(registry)`), both in 0.20.
    "prometheus-client>=0.20",
    "absl-py>=2.1",
    "zstandard>=0.22",
    "pyarrow>=15",
    "array-record>=0.7",
    "google-crc32c>=1.5",  # TFRecord's framing checksums (crc32c) without TensorFlow
    "tqdm>=4.66",
    "psutil>=5.9",  # autotune measures worker memory (RSS)
    "orjson>=3.9",  # several times faster JSON lines than the standard library
    "pysimdjson>=6.0",  # JSON lists of token ids read into arrays, no Python int a token
    "jax>=0.4.35",  # the demo places batches on devices and times steps
]

if os.environ.get("INPUT_SERVER_BUILD_EDITABLE") == "1":
    packages = find_packages(include=["input_server*"]) + find_packages(
        "client", include=["input_client*"]
    )
    package_dir = {"input_client": "client/input_client"}
    client_requires = list(CLIENT["dependencies"])
else:
    packages = find_packages(include=["input_server*"])
    package_dir = {}
    client_requires = [f"input-client=={CLIENT['version']}"]

setup(
    packages=packages, package_dir=package_dir, install_requires=client_requires + SERVER_REQUIRES
)
