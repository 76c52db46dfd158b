"""The files a deployment reads say what the rest of the repository does: the README's front matter
is a Space configuration Hugging Face accepts (docs/hub/spaces-config-reference.md) for the pinned
Gradio and a Python that ZeroGPU offers and transformers takes, and the Dockerfile builds from files
the repository has and serves where it says."""

import re
import shlex
from pathlib import Path

import yaml
from huggingface_hub import SpaceHardware

ROOT = Path(__file__).parent.parent
# Every key the Spaces configuration reference accepts (hub-docs, docs/hub/spaces-config-reference.md).
SPACE_KEYS = {"title", "emoji", "colorFrom", "colorTo", "sdk", "python_version", "sdk_version",
              "suggested_hardware", "suggested_storage", "app_file", "app_build_command", "app_port",
              "base_path", "fullWidth", "header", "short_description", "models", "datasets", "tags",
              "thumbnail", "pinned", "hf_oauth", "hf_oauth_scopes", "hf_oauth_expiration_minutes",
              "hf_oauth_authorized_org", "disable_embedding", "startup_duration_timeout",
              "custom_headers", "preload_from_hub", "license"}
COLORS = {"red", "yellow", "green", "blue", "indigo", "purple", "pink", "gray"}
ZEROGPU_PYTHONS = ("3.10", "3.12")  # the Pythons ZeroGPU runs (docs/hub/spaces-zerogpu.md)


def front_matter() -> dict:
    text = (ROOT / "README.md").read_text()
    assert text.startswith("---\n"), "a Space reads its configuration from the README's first lines"
    return yaml.safe_load(text.split("---\n", 2)[1])


def pins() -> dict[str, str]:
    found = {}
    for line in (ROOT / "requirements.txt").read_text().splitlines():
        if m := re.match(r"([A-Za-z0-9_.-]+)==([^\s#;]+)", line):
            found[m[1].lower()] = m[2]
    return found


def minor(version: str) -> tuple[int, int]:
    return tuple(int(part) for part in version.split(".")[:2])


def test_the_front_matter_is_a_space_configuration():
    config = front_matter()
    assert set(config) <= SPACE_KEYS, set(config) - SPACE_KEYS
    assert config["sdk"] == "gradio" and config["sdk_version"] == pins()["gradio"]
    assert (ROOT / config["app_file"]).is_file()
    assert {config["colorFrom"], config["colorTo"]} <= COLORS
    assert config["suggested_hardware"] in {flavor.value for flavor in SpaceHardware}
    assert 0 < len(config["short_description"]) <= 60  # the Hub's limit for the card's line
    assert all(isinstance(m, str) and m.count("/") == 1 for m in config["models"])
    # a quoted string: a bare 3.10 would be read as the number 3.1
    python = config["python_version"]
    assert isinstance(python, str) and python.startswith(ZEROGPU_PYTHONS)
    needed = re.search(r'requires-python = ">=([\d.]+)"', (ROOT / "pyproject.toml").read_text())[1]
    assert minor(python) >= minor(needed)


def dockerfile() -> list[tuple[str, str]]:
    """(instruction, arguments) of each Dockerfile line, continuations joined, comments dropped."""
    text = re.sub(r"\\\n\s*", " ", (ROOT / "Dockerfile").read_text())
    return [(line.split(None, 1)[0].upper(), line.split(None, 1)[1]) for line in text.splitlines()
            if line.strip() and not line.lstrip().startswith("#")]


def test_the_dockerfile_builds_from_the_repository_and_serves_on_its_port():
    steps = dockerfile()
    base = next(args for op, args in steps if op == "FROM")
    python = re.fullmatch(r"python:(\d+\.\d+)-slim", base)
    needed = re.search(r'requires-python = ">=([\d.]+)"', (ROOT / "pyproject.toml").read_text())[1]
    assert python and minor(python[1]) >= minor(needed), base
    for op, args in steps:
        if op == "COPY":
            sources = [word for word in shlex.split(args) if not word.startswith("--")][:-1]
            assert all((ROOT / source).exists() for source in sources), args
    env = dict(pair.split("=", 1) for op, args in steps if op == "ENV" for pair in shlex.split(args))
    assert env["GRADIO_SERVER_NAME"] == "0.0.0.0" and env["SPECVIZ_IN_CONTAINER"] == "1"
    assert [args for op, args in steps if op == "EXPOSE"] == [env["GRADIO_SERVER_PORT"]]
    assert [args for op, args in steps if op == "USER"] == ["user"]  # not root, before every RUN but useradd
    assert [op for op, _ in steps].index("USER") < [op for op, _ in steps].index("RUN", 2)
    assert any("-r requirements.txt" in args for op, args in steps if op == "RUN")
    assert any(args == "python -m specviz prepare" for op, args in steps if op == "RUN")
    assert [args for op, args in steps if op == "CMD"] == [f'["python", "{front_matter()["app_file"]}"]']


def test_the_docker_context_leaves_out_what_git_ignores():
    """`COPY . .` takes the build context: a virtual environment (the README's, several GB) or a
    test run's output would go into the image."""
    def patterns(name: str) -> set[str]:
        lines = (ROOT / name).read_text().splitlines()
        return {line.strip().strip("/").removeprefix("**/") for line in lines if line.strip()}

    ignored = patterns(".dockerignore")
    assert ".git" in ignored
    # a compiled file sits in __pycache__, which both leave out
    assert patterns(".gitignore") - {"*.pyc"} <= ignored, patterns(".gitignore") - ignored
