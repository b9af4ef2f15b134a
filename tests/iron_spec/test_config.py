"""config.json accounting at every load: every key read by a field, ignored on purpose, or
the load refused (``iron_spec.config.account``), as ``lint --config`` reports it."""

from __future__ import annotations

import json
import re

import pytest
import typer
from typer.testing import CliRunner

from iron_spec.build import load_model
from iron_spec.cli import app
from iron_spec.encoder import load_encoder
from iron_spec.errors import SpecError
from iron_spec.loader import load_spec
from iron_spec.show import gather
from tests.conftest import SPECS

LLAMA = SPECS / "llama3.yaml"
runner = CliRunner()


def config_dir(tmp_path, spec=LLAMA, **extra):
    """A checkpoint directory holding only ``spec``'s toy config.json plus ``extra`` keys
    (weights are drawn: ``random_weights``)."""
    config = {**load_spec(spec).get("toy", "config"), **extra}
    (tmp_path / "config.json").write_text(json.dumps(config))
    return tmp_path


def test_every_unread_key_refused_in_one_error_naming_the_file(tmp_path):
    d = config_dir(tmp_path, use_parallel_residual=True, rope_thetaa=1.0)
    with pytest.raises(SpecError) as e:
        load_model(LLAMA, checkpoint=d, random_weights=0)
    text = str(e.value)
    path = re.escape(str(d / "config.json"))
    assert re.search(rf"{path}: key 'use_parallel_residual' \(= True\) is neither mapped", text)
    assert re.search(rf"{path}: key 'rope_thetaa' \(= 1.0\) is neither mapped", text)
    # At the spec's ignore: list, where the fix goes.
    line = next(i for i, t in enumerate(LLAMA.read_text().splitlines(), 1) if t.startswith("ignore:"))
    assert (e.value.line, e.value.col) == (line, 1)


def test_allow_unread_config_loads_anyway(tmp_path):
    d = config_dir(tmp_path, use_parallel_residual=True)
    lm = load_model(LLAMA, checkpoint=d, random_weights=0, allow_unread_config=True).lm
    assert lm.config.hidden_size == 64


def test_ignored_and_mapped_keys_load(tmp_path):
    d = config_dir(tmp_path, initializer_range=0.02)  # under llama3's ignore:
    assert load_model(LLAMA, checkpoint=d, random_weights=0).lm.config.vocab_size == 256


def test_encoder_and_show_refuse_too(tmp_path):
    bert = SPECS / "bert.yaml"
    d = config_dir(tmp_path, bert, use_bidirectional_attention=False)
    with pytest.raises(SpecError, match="key 'use_bidirectional_attention' .* neither mapped"):
        load_encoder(bert, checkpoint=d, random_weights=0)
    assert load_encoder(bert, checkpoint=d, random_weights=0, allow_unread_config=True)
    with pytest.raises(SpecError, match="key 'use_bidirectional_attention'"):
        gather(bert, str(d))
    with pytest.raises(FileNotFoundError, match="no such weights file"):  # past the config
        gather(bert, str(d), allow_unread_config=True)


@pytest.mark.parametrize("command", ["run", "check", "show", "bench"])
def test_every_loading_command_refuses_and_takes_the_flag(tmp_path, command):
    d = config_dir(tmp_path, extra_key=3)
    args = [command, str(LLAMA), "--checkpoint", str(d)]
    if command != "show":
        args += ["--random-weights", "0"]
    refused = runner.invoke(app, args)
    assert refused.exit_code != 0 and "key 'extra_key' (= 3) is neither mapped" in refused.output


def flags(command: str) -> set[str]:
    return {o for p in typer.main.get_command(app).commands[command].params for o in p.opts}


@pytest.mark.parametrize("command", ["run", "check", "show", "bench", "embed"])
def test_every_loading_command_takes_the_flag(command):
    assert "--allow-unread-config" in flags(command)
