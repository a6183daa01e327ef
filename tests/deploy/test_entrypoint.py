"""The image's entrypoint without podman: which arguments the container's arguments and
environment become, and the errors an operator sees."""

from __future__ import annotations

import importlib.util
from pathlib import Path
from types import ModuleType

import pytest

from stack.cli import build_parser
from tests.deploy.podman import REPO


def load_entrypoint() -> ModuleType:
    path = REPO / "deploy" / "image" / "entrypoint.py"
    spec = importlib.util.spec_from_file_location("image_entrypoint", path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


entry = load_entrypoint()


def test_placeholders_take_the_environment_then_the_default() -> None:
    text = 'a = "${A}"\nb = ${B:-7}\nc = "${C:-}"\n'
    assert entry.expand(text, {"A": "x", "B": "9"}, "f") == 'a = "x"\nb = 9\nc = ""\n'
    assert entry.expand(text, {"A": "x"}, "f") == 'a = "x"\nb = 7\nc = ""\n'


def test_unset_placeholder_names_the_variable_and_the_file() -> None:
    with pytest.raises(entry.EntrypointError, match=r"conf.toml: \$\{TOKEN\} is not set"):
        entry.expand('t = "${TOKEN}"', {}, "conf.toml")


def test_config_is_added_only_to_commands_that_take_one(tmp_path: Path) -> None:
    conf = tmp_path / "c.toml"
    conf.write_text("[proxy]\nport = 1\n")
    env = {"CHAINSTATE_CONFIG": str(conf)}
    parser = build_parser()
    argv = entry.build_argv(["proxy", "--port", "2"], env, parser, tmp_path)
    assert argv == ["proxy", "--config", str(conf), "--port", "2"]
    # a command without --config, a nested one, and one given its own --config are unchanged
    assert entry.build_argv(["devnet", "anvil"], env, parser, tmp_path) == ["devnet", "anvil"]
    given = ["proxy", "--config=/x.toml"]
    assert entry.build_argv(given, env, parser, tmp_path) == given
    leveled = entry.build_argv(
        ["checker"], {**env, "CHAINSTATE_LOG_LEVEL": "info"}, parser, tmp_path
    )
    assert leveled == ["--log-level", "info", "checker", "--config", str(conf)]


def test_rendered_copy_keeps_relative_paths_working(tmp_path: Path) -> None:
    mounted = tmp_path / "etc"
    mounted.mkdir()
    (mounted / "genesis.json").write_text("{}")
    (mounted / "c.toml").write_text('genesis = "genesis.json"\nurl = "http://${HOST}:1"\n')
    (mounted / "other.toml").write_text('x = "${UNSET}"\n')  # not the chosen file: untouched
    work = tmp_path / "work"
    rendered = entry.render_config(mounted / "c.toml", {"HOST": "anvil"}, work)
    assert rendered.read_text() == 'genesis = "genesis.json"\nurl = "http://anvil:1"\n'
    assert (rendered.parent / "genesis.json").read_text() == "{}"
    assert (rendered.parent / "other.toml").read_text() == 'x = "${UNSET}"\n'
    assert "${HOST}" in (mounted / "c.toml").read_text()  # the mounted file is left alone
    plain = mounted / "plain.toml"
    plain.write_text("x = 1\n")
    assert entry.render_config(plain, {}, work) == plain


def test_missing_config_file_is_an_error(tmp_path: Path) -> None:
    with pytest.raises(entry.EntrypointError, match="does not exist"):
        entry.build_argv(
            ["proxy"], {"CHAINSTATE_CONFIG": str(tmp_path / "no.toml")}, build_parser(), tmp_path
        )


def test_comments_keep_their_placeholders() -> None:
    text = "url = \"http://${H}:1#x\" # set ${H} or ${OTHER}\n# ${OTHER}\nk = '#${H}'\n"
    assert entry.expand(text, {"H": "a"}, "f") == (
        "url = \"http://a:1#x\" # set ${H} or ${OTHER}\n# ${OTHER}\nk = '#a'\n"
    )
