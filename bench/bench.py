"""The same measurements as ``iron-spec bench``, as a script:

    python bench/bench.py specs/llama3.yaml --checkpoint DIR [--runs 3] [--json]

Run it from the golden venv (torch + transformers installed) to measure the peer side by side.
"""

from iron_spec.cli.bench import command
import typer

if __name__ == "__main__":
    typer.run(command)
