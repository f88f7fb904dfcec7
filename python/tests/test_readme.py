"""The README's "Hello" section, run as written against a real node: each
``$ redis-cli ...`` line of its console block (on this test's port in
place of 7379) must print what the block shows after it, and its Python
block must print what its ``# ...`` comments say."""

from __future__ import annotations

import contextlib
import io
import re
import shlex
import subprocess

import pytest

from servers import ROOT, Server

README = (ROOT / "README.md").read_text()


def hello_section() -> str:
    return re.search(r"^## Hello$(.*?)^## ", README, re.S | re.M).group(1)


def console_steps():
    """(command, expected output lines) per ``$`` line of the console block."""
    block = re.search(r"```console\n(.*?)```", hello_section(), re.S).group(1)
    steps = []
    for line in block.splitlines():
        if line.startswith("$ "):
            steps.append((line[2:].split("#")[0].strip(), []))
        elif steps and line.strip():
            steps[-1][1].append(line.strip())
    return steps


def python_block() -> str:
    return re.search(r"```python\n(.*?)```", hello_section(), re.S).group(1)


@pytest.fixture(scope="module")
def node():
    s = Server()
    yield s
    s.stop()


def test_the_readme_hello_has_commands():
    assert len(console_steps()) >= 4
    assert "strata.Client" in python_block()


def test_the_readme_redis_cli_hello_prints_what_it_shows(node):
    for command, expected in console_steps():
        argv = shlex.split(command.replace("-p 7379", f"-p {node.port}"))
        assert argv[0] == "redis-cli", command
        # As on a terminal: quoted strings, "(integer)".
        argv.insert(1, "--no-raw")
        out = subprocess.run(argv, capture_output=True, text=True, timeout=10)
        assert out.returncode == 0, f"{command}: {out.stderr}"
        assert not out.stdout.startswith("(error)"), f"{command}: {out.stdout}"
        if expected:
            assert out.stdout.strip().splitlines() == expected, command


def test_the_readme_python_hello_prints_what_its_comments_say(node):
    code = python_block().replace("127.0.0.1:7379", node.addr)
    wanted = [m.group(1).strip() for line in code.splitlines() if line.startswith("print(")
              for m in [re.search(r"#\s*(.*)$", line)] if m]
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        exec(compile(code, "README.md (Hello)", "exec"), {})
    assert out.getvalue().strip().splitlines() == wanted
