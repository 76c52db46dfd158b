"""What the README tells a newcomer to type works as written: its Python examples run (on the
tiny pair, in place of the embedded one) and every `python -m specviz` command it shows parses and
passes every check its command makes before loading models."""

import re
import shlex
from pathlib import Path

import pytest

import specviz
from specviz import cli, loading, presets

README = (Path(__file__).parent.parent / "README.md").read_text()


def fenced(text: str) -> list[tuple[str, str]]:
    """(language, body) of each fenced block, fences paired in order."""
    blocks, language, body = [], None, []
    for line in text.splitlines():
        if line.startswith("```"):
            if language is None:
                language, body = line[3:].strip(), []
            else:
                blocks.append((language, "\n".join(body) + "\n"))
                language = None
        elif language is not None:
            body.append(line)
    return blocks


def python_blocks(text: str) -> list[str]:
    return [body for language, body in fenced(text) if language == "python"]


def specviz_commands(text: str) -> list[str]:
    """Each `python -m specviz <subcommand> ...` in a shell block (continuation lines joined) or in
    inline code; `python -m specviz.<module>` entry points are their modules' own."""
    found = []
    for block in (body for language, body in fenced(text) if language in ("bash", "sh")):
        found += [line.strip() for line in block.replace("\\\n", " ").splitlines()
                  if line.strip().startswith("python -m specviz ")]
    found += re.findall(r"`(python -m specviz [^`]*)`", text)
    return found


def test_the_readme_shows_its_examples():
    # the extraction itself: a README rewrite that hid them from these tests would pass them vacuously
    assert len(python_blocks(README)) >= 2
    assert len(specviz_commands(README)) >= 5


def test_the_readmes_python_examples_run(pair, monkeypatch, capsys):
    monkeypatch.setattr(specviz, "load_pair", lambda *args, **kwargs: pair)
    namespace: dict = {}
    for block in python_blocks(README):
        exec(compile(block, "README.md", "exec"), namespace)
    lines = capsys.readouterr().out.splitlines()
    assert len(lines) >= 4
    assert isinstance(namespace["stats"], specviz.RunStats)
    assert namespace["stats"].tokens_per_pass >= 1.0
    # the tree example's last line: round, nodes verified, accepted, then the nodes
    round_number, nodes, accepted = (int(x) for x in lines[-1].split()[:3])
    assert round_number > 1 and 0 <= accepted <= nodes <= 64


class Loading(Exception):
    """Raised where the command would load its models: every check before that has passed."""


@pytest.mark.parametrize("command", specviz_commands(README))
def test_every_command_the_readme_shows_is_accepted(command, monkeypatch):
    argv = shlex.split(command, comments=True)[3:]
    args = cli.build_parser().parse_args(argv)  # a bad flag or value exits 2
    if args.command not in ("run", "bench"):
        return  # the others' work starts at once (gpucheck's is minutes): parsed is what can be checked
    monkeypatch.setattr(loading, "load_pair", raises_loading)
    monkeypatch.setattr(presets, "load", raises_loading)
    with pytest.raises(Loading):  # not exit 2 for a setting that cannot work
        cli.main(argv)


def raises_loading(*args, **kwargs):
    raise Loading
