"""`input-server serve`'s flags are `ServerConfig`'s fields: each help and default is the
field's, written once."""

from __future__ import annotations

import dataclasses
import os

import pytest

from input_server.cli import build_parser, serve
from input_server.serving.config import ServerConfig, help_of


def _serve_help(monkeypatch, capsys) -> str:
    monkeypatch.setenv("COLUMNS", "100000")  # argparse wraps at hyphens too: a flag a line
    with pytest.raises(SystemExit):
        build_parser().parse_args(["serve", "--help"])
    return capsys.readouterr().out


@pytest.mark.parametrize("field", [f.name for f in serve.FIELDS])
def test_every_field_is_a_flag_with_the_fields_help(field, monkeypatch, capsys):
    flag = serve.FLAG_EXTRAS.get(field, {}).get("flag", "--" + field.replace("_", "-"))
    help_text = _serve_help(monkeypatch, capsys)
    # The flag's entry: its line, and the next when the flag is long, up to the next flag.
    _, entry = help_text.split(f"\n  {flag} ", 1)
    entry = entry.split("\n  -", 1)[0]
    assert help_of(field) in " ".join(entry.split()), entry


def test_no_flag_given_is_the_configs_own_defaults(monkeypatch, tmp_path):
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    config = serve.config_of(build_parser().parse_args(["serve"]))
    # The CLI's defaults of its own: the tune and tokenizer caches on disk.
    assert config == ServerConfig(
        tune_cache=str(tmp_path / "input-server" / "tune"),
        tokenizer_cache=str(tmp_path / "input-server" / "tokenizers"),
    )


def test_given_flags_reach_the_config(tmp_path):
    args = build_parser().parse_args(
        [
            *("serve", "--max-streams", "3", "--grace-s", "1.5", "--insecure-tcp"),
            *("--data-root", str(tmp_path), "--listen", "127.0.0.1:0", "--tune-cache", "off"),
            *("--tokenizer-cache", "off"),
        ]
    )
    config = serve.config_of(args)
    assert (config.max_streams, config.grace_s, config.insecure_tcp) == (3, 1.5, True)
    assert config.data_roots == (os.path.realpath(tmp_path),)
    assert list(config.listen) == ["127.0.0.1:0"] and config.tune_cache is None
    assert config.tokenizer_cache is None
    others = {"max_streams", "grace_s", "insecure_tcp", "data_roots", "listen", "tune_cache"}
    others.add("tokenizer_cache")
    for f in dataclasses.fields(ServerConfig):
        if f.name not in others | {"pipelines"}:
            assert getattr(config, f.name) == getattr(ServerConfig(), f.name), f.name
