"""The root's build backend: setuptools, told whether it builds an editable install.

This repository holds two distributions. `input-client` (client/pyproject.toml) is the thin
client; `input-server` (the root) is the server and depends on it. A built `input-server` wheel
holds only `input_server` and requires `input-client` of the same version by name, as the two
would be published. An editable install (`pip install -e .`, the README's command) is a working
checkout instead: both packages come from the tree, so an edit to the client is what the tests
and servers run, and the client's own requirements are installed in its place. pip offers no
editable install of a dependency, hence this switch; setup.py reads it.
"""

from __future__ import annotations

import os

from setuptools import build_meta as _setuptools
from setuptools.build_meta import *  # noqa: F403  (every other hook is setuptools' own)

EDITABLE_ENV = "INPUT_SERVER_BUILD_EDITABLE"


def _editable() -> None:
    os.environ[EDITABLE_ENV] = "1"


def get_requires_for_build_editable(config_settings=None):
    _editable()
    return _setuptools.get_requires_for_build_editable(config_settings)


def prepare_metadata_for_build_editable(metadata_directory, config_settings=None):
    _editable()
    return _setuptools.prepare_metadata_for_build_editable(metadata_directory, config_settings)


def build_editable(wheel_directory, config_settings=None, metadata_directory=None):
    _editable()
    return _setuptools.build_editable(wheel_directory, config_settings, metadata_directory)
