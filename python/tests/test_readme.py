"""The README's "Hello" section, run as written against a real node: each
``$ redis-cli ...`` line of its console block (on this test's port in
place of 7379) must print what the block shows after it, and its Python
block must print what its ``# ...`` comments say."""

from __future__ import annotations

import contextlib
import io
import json
import os
import re
import shlex
import subprocess

import pytest

from servers import ROOT, Server, server_binary

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


def one_node_lines():
    """The commands of the README's "One node" quick start, with comments."""
    section = re.search(r"^### One node$(.*?)^### ", README, re.S | re.M).group(1)
    block = re.search(r"```sh\n(.*?)```", section, re.S).group(1)
    return [(line.split("#")[0].strip(), line.partition("#")[2].strip())
            for line in block.splitlines() if line.strip()]


def effective_config(command: str, cwd) -> dict:
    """`command` as written, with `--print-config` (the node's effective
    values, without starting it)."""
    words = shlex.split(command)
    env = {k: v for k, v in os.environ.items() if not k.startswith("STRATA_")}
    while "=" in words[0]:
        name, _, value = words.pop(0).partition("=")
        env[name] = value
    assert words[0] == "strata-server", command
    argv = [str(server_binary()), *words[1:]]
    if "--print-config" not in argv:
        argv.append("--print-config")
    out = subprocess.run(argv, capture_output=True, text=True, timeout=30, cwd=cwd, env=env)
    assert out.returncode == 0, f"{command}: {out.stderr}"
    return json.loads(out.stdout)


def test_the_readme_one_node_commands_do_what_they_say(tmp_path):
    """Each line of the block, run from a directory holding a `strata.json`:
    the first line's comment states the defaults, the others the source
    they read the port from."""
    (tmp_path / "strata.json").write_text(json.dumps({"port": 7400}))
    lines = one_node_lines()
    assert len(lines) >= 5, lines
    seen = set()
    for command, comment in lines:
        cfg = effective_config(command, tmp_path)
        if command == "strata-server":
            m = re.match(r"standalone, ([\d.]+):(\d+), (\d+) GiB DRAM \+ (\d+) GiB NVMe \(temp dir\)",
                         comment)
            assert m, f"the first line's comment no longer states the defaults: {comment}"
            assert (cfg["bind"], cfg["port"]) == (m.group(1), int(m.group(2)))
            assert cfg["cpu_memory_pool_size"] == int(m.group(3)) << 30
            assert cfg["ssd_pool_size"] == int(m.group(4)) << 30
            assert cfg["ssd_path"] == "" and cfg["metadata_server"] == []
            seen.add("defaults")
        elif "--print-config" not in command:
            assert cfg["port"] == 7400, f"{command} ({comment}) did not set the port"
            seen.add(comment)
    assert {"defaults", "file", "environment", "flags"} <= seen, seen
