"""The supervision files in docs/deploy/, run outside their supervisor (no container runtime or
systemd instance is needed): `systemd-analyze verify` accepts both units without a warning; each
unit's ExecStart is a valid ebb command line; the serve unit's command and its health check
(ExecStartPost) run for real, over mutual TLS, and SIGTERM stops the server with exit 0; the
Dockerfile's HEALTHCHECK command passes on a healthy server, fails on a dead one and passes when
no server is configured; and the container's default command (ENTRYPOINT + CMD) runs the demo."""

from __future__ import annotations

import json
import os
import re
import shlex
import shutil
import signal
import socket
import subprocess
import sys

import numpy as np
import pytest

from ebb.tools.cli import build_parser
from ebb.storage.archive import Archive

from support import SCHEMA, config, random_rows, table_of
from test_tls import make_pki

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
DEPLOY = os.path.join(ROOT, "docs", "deploy")
EBB = "/opt/ebb/bin/ebb"  # where the units expect ebb


def unit(name: str) -> dict[str, list[str]]:
    """The [Service] settings of a unit file: key -> values, in order."""
    out: dict[str, list[str]] = {}
    section = None
    with open(os.path.join(DEPLOY, name)) as f:
        for line in f:
            line = line.strip()
            if line.startswith("["):
                section = line
            elif line and not line.startswith("#") and section == "[Service]":
                key, _, value = line.partition("=")
                out.setdefault(key, []).append(value)
    return out


def dockerfile() -> dict[str, str]:
    """The final stage's instructions of docs/deploy/Dockerfile (continuation lines joined)."""
    with open(os.path.join(DEPLOY, "Dockerfile")) as f:
        text = re.sub(r"\\\n\s*", "", f.read())
    final = text.split("\nFROM ")[-1]
    return {m[0]: m[1] for m in re.findall(r"^([A-Z]+) (.*)$", final, re.M)}


def systemd_arg(value: str, env: dict[str, str]) -> list[str]:
    """A unit's command line as systemd passes it: ${VAR} replaced whole, $VAR as a word split at
    whitespace, %i the instance, $$ a literal $."""
    words = []
    for w in shlex.split(value.replace("%i", "demo")):
        if re.fullmatch(r"\$[A-Z_]+", w):
            words += env.get(w[1:], "").split()
        else:
            words.append(re.sub(r"(?<!\$)\$\{([A-Z_]+)\}", lambda m: env.get(m[1], ""), w).replace("$$", "$"))
    return words


@pytest.mark.skipif(not shutil.which("systemd-analyze"), reason="systemd-analyze is not installed")
def test_systemd_accepts_the_units(tmp_path):
    ebb = shutil.which("ebb")
    assert ebb, "the ebb console script is not on PATH"
    for name in ("ebb-run@.service", "ebb-serve@.service"):
        text = open(os.path.join(DEPLOY, name)).read().replace(EBB, ebb)  # verify checks that ExecStart exists
        (tmp_path / name.replace("@", "@demo")).write_text(text)
    r = subprocess.run(["systemd-analyze", "verify", "--man=no", "ebb-run@demo.service", "ebb-serve@demo.service"],
                       cwd=tmp_path, capture_output=True, text=True)
    assert r.returncode == 0 and r.stdout + r.stderr == "", r.stdout + r.stderr  # a bad setting is only a warning


def test_the_units_stop_cleanly_and_their_commands_parse():
    run, serve = unit("ebb-run@.service"), unit("ebb-serve@.service")
    for u in (run, serve):
        assert u["Restart"] == ["on-failure"] and u["KillSignal"] == ["SIGTERM"] and int(u["TimeoutStopSec"][0]) >= 60
        assert u["EnvironmentFile"]
    assert run["KillMode"] == ["mixed"]  # SIGTERM to ebb alone: Spark's JVM must outlive a commit under way
    with open(os.path.join(DEPLOY, "ebb-serve.env.example")) as f:
        env = dict(line.strip().split("=", 1) for line in f if line.strip() and not line.startswith("#"))
    for u in (run, serve):
        argv = systemd_arg(u["ExecStart"][0], env)
        assert argv[0] == EBB
        build_parser().parse_args(argv[1:])  # exits (SystemExit) on a wrong option


def _archive(path: str) -> None:
    with Archive.create(path, config()) as arc:
        arc.load(table_of(random_rows(np.random.default_rng(2), 40, 1, 16, 16, 10), SCHEMA), 16)


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_the_serve_unit_runs_and_its_health_check_passes(tmp_path):
    """ExecStart and ExecStartPost of ebb-serve@.service as systemd would run them, with the
    example environment file pointed at certificates made here."""
    pki = make_pki(tmp_path / "pki")
    srv = tmp_path / "srv"
    _archive(str(srv / "demo" / "archive"))
    with open(os.path.join(DEPLOY, "ebb-serve.env.example")) as f:
        text = f.read().replace("/etc/ebb/tls", str(pki))
    env = dict(line.strip().split("=", 1) for line in text.splitlines() if line.strip() and not line.startswith("#"))
    env["EBB_PORT"] = str(_free_port())
    serve = unit("ebb-serve@.service")
    ebb = [sys.executable, "-m", "ebb.tools.cli"]

    def command(value: str) -> list[str]:
        argv = systemd_arg(value.replace("/srv/ebb", str(srv)), env)
        return [*ebb, *argv[1:]] if argv[0] == EBB else argv

    full_env = {**os.environ, **env}
    p = subprocess.Popen(command(serve["ExecStart"][0]), env=full_env, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                         text=True)
    try:
        check = command(serve["ExecStartPost"][0])
        assert check[:2] == ["/bin/sh", "-c"]
        check[2] = check[2].replace(EBB, shlex.join(ebb))
        r = subprocess.run(check, env=full_env, capture_output=True, text=True, timeout=120)
        assert r.returncode == 0, (r.stdout, r.stderr)
        assert "mutual TLS" in p.stdout.readline()
    finally:
        p.send_signal(signal.SIGTERM)
        out, err = p.communicate(timeout=30)
    assert p.returncode == 0 and err.strip().endswith("ebb: server stopped by SIGTERM (the running calls finished)"), err


def test_the_container_health_check(tmp_path):
    instr = dockerfile()
    check = json.loads(instr["HEALTHCHECK"].split(" CMD ", 1)[1])
    assert check[:2] == ["/bin/sh", "-c"] and "ebb health" in check[2]
    path = str(tmp_path / "arc")
    _archive(path)
    env = {**os.environ, "PATH": f"{os.path.dirname(shutil.which('ebb'))}:{os.environ['PATH']}"}
    env.pop("EBB_HEALTH_SERVER", None)
    assert subprocess.run(check, env=env).returncode == 0  # not serving: nothing to check
    p = subprocess.Popen([sys.executable, "-m", "ebb.tools.cli", "serve", path, "--port", "0"],
                         stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        url = p.stdout.readline().split(" at ")[1].split()[0]
        r = subprocess.run(check, env={**env, "EBB_HEALTH_SERVER": url}, capture_output=True, text=True)
        assert r.returncode == 0 and json.loads(r.stdout)["status"] == "ok", r.stderr
    finally:
        p.send_signal(signal.SIGTERM)
        p.communicate(timeout=30)
    r = subprocess.run(check, env={**env, "EBB_HEALTH_SERVER": url}, capture_output=True, text=True)
    assert r.returncode == 1 and "unhealthy" in r.stderr


def test_the_container_command_is_the_demo():
    """ENTRYPOINT + CMD: `ebb demo` under tini (which only forwards signals). The demo as the image
    and the README run it (no arguments) runs in CI from the built wheel (.ci/run); a smaller one
    in test_cli.py."""
    instr = dockerfile()
    argv = json.loads(instr["ENTRYPOINT"]) + json.loads(instr["CMD"])
    assert argv == ["/usr/bin/tini", "--", "ebb", "demo"]


def ops_examples() -> list[tuple[str, str]]:
    """The ```sh blocks of docs/operations.md's "TLS" and "Health checks" under "Running in production"."""
    with open(os.path.join(ROOT, "docs", "operations.md")) as f:
        text = f.read()
    section = text.split("\n## Running in production\n", 1)[1].split("\n## ", 1)[0]
    out = []
    for part in re.split(r"\n(?=### )", section):
        title = part.splitlines()[0].removeprefix("### ")
        if title in ("TLS", "Health checks"):
            out += [(title, block) for block in re.findall(r"```sh\n(.*?)```", part, re.S)]
    return out


@pytest.mark.skipif(not shutil.which("openssl"), reason="the TLS example makes its certificates with openssl")
def test_the_operations_examples_run(tmp_path):
    examples = ops_examples()
    assert [t for t, _ in examples] == ["TLS", "Health checks"]
    _archive(str(tmp_path / "arc"))
    bin_dir = os.path.dirname(shutil.which("ebb"))
    for title, block in examples:
        script = block.replace("/data/arc", str(tmp_path / "arc")).replace("8815", str(_free_port()))
        r = subprocess.run(["bash", "-e", "-o", "pipefail", "-c", script], cwd=tmp_path, capture_output=True,
                           text=True, timeout=300, env={**os.environ, "PATH": f"{bin_dir}:{os.environ['PATH']}"})
        assert r.returncode == 0, (title, r.stdout, r.stderr)
        if title == "TLS":
            assert "refused: exit 1" in r.stdout and "server stopped by SIGTERM" in r.stderr, (r.stdout, r.stderr)
        else:
            assert "unhealthy" not in r.stdout, r.stdout  # committed seconds ago: within --max-age
