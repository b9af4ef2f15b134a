"""A serve file's (``iron-spec serve --config FILE``) model entries: an option it gives that
is refused is named as the file spells it (``max_seq_len: 100000``, with the file and the
entry), never as the command's flag nor the library's keyword; a flag given beside the file
overrides the file's value and is named as the flag."""

from __future__ import annotations

import pytest
from typer.testing import CliRunner

from iron_spec.cli.app import app
from iron_spec.cli.server.config import ConfigError, load_models, read_config

pytest.importorskip("uvicorn")

TOY = "{spec: llama3, random_weights: 0, toy: true"  # the toy's own context is 512


def serve(path, *flags):
    return CliRunner().invoke(app, ["serve", "--config", str(path), "--port", "0", *flags],
                              env={"COLUMNS": "300"})


@pytest.mark.parametrize("entry, says", [
    (TOY + ", max_seq_len: 100000}", "max_seq_len: 100000 is not within 1..512"),
    (TOY + ", max_seq_len: 32, prefill_chunk: 64}", "prefill_chunk: 64 is past the context "
                                                    "max_seq_len 32"),
    (TOY + ", weights: q9}", "weights: q9 is not one of stored, float32"),
    ("{spec: llama3, toy: true}", "toy: true needs random_weights: SEED"),
    (TOY + ", max_seq_len: '64'}", "max_seq_len is '64' (str); it is a whole number >= 1")])
def test_a_serve_files_model_option_is_named_as_the_file_spells_it(tmp_path, entry, says):
    # Found by a fresh user's trial: "model 'toy': --max-seq-len 100000 is not within 1..512"
    # for a file's max_seq_len: a flag they never gave, and neither the file nor its key.
    path = tmp_path / "serve.yaml"
    path.write_text(f"models:\n  toy: {entry}\n")
    result = serve(path)
    assert result.exit_code == 1, result.output
    said = " ".join(result.output.split())
    assert f"error: {path}: models.toy: {says}" in said, said
    assert "--" not in said.split("models.toy:", 1)[1], said
    # Loaded without the command (Ray Serve's deployment): the file's spelling too.
    with pytest.raises(ConfigError) as raised:
        load_models(read_config(path))
    assert str(raised.value).startswith(f"{path}: models.toy: {says}")


def test_a_flag_beside_a_serve_file_overrides_its_value_and_is_named_as_the_flag(tmp_path):
    # Found with the above: --max-seq-len beside --config was dropped unread, though --config's
    # help says the flags given override the file.
    path = tmp_path / "serve.yaml"
    path.write_text(f"models:\n  toy: {TOY}, max_seq_len: 32, prefill_chunk: 64}}\n")
    result = serve(path, "--max-seq-len", "100000")
    assert result.exit_code == 1, result.output
    said = " ".join(result.output.split())
    assert f"error: {path}: models.toy: --max-seq-len 100000 is not within 1..512" in said, said
    # No file: the flag, as before.
    result = CliRunner().invoke(app, ["serve", "llama3", "--toy", "--random-weights", "0",
                                      "--name", "toy", "--port", "0", "--max-seq-len", "100000"],
                                env={"COLUMNS": "300"})
    assert result.exit_code == 1, result.output
    assert "error: model 'toy': --max-seq-len 100000 is not within 1..512" in \
        " ".join(result.output.split()), result.output
