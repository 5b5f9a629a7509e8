"""Real processes for the end-to-end tests: free ports, and a set of processes stopped as a group."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import time
import urllib.request
from pathlib import Path


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def port_free(port: int) -> bool:
    """No process listens on ``port`` (a restarted server could bind it; TIME_WAIT leftovers of
    closed connections do not count, as for any server that sets SO_REUSEADDR)."""
    with socket.socket() as s:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            s.bind(("127.0.0.1", port))
            return True
        except OSError:
            return False


class Processes:
    """Every process the test starts, each in its own session (so its children go with it)."""

    def __init__(self, env: dict[str, str], logs: Path) -> None:
        self.env, self.logs, self.procs = env, logs, {}

    def start(self, name: str, cmd: list[str], cwd: Path, env: dict[str, str] | None = None) -> subprocess.Popen:
        """Start ``cmd`` as ``name`` in ``cwd``, in a session of its own, with the shared
        environment updated by ``env``; its output goes to ``logs/<name>.log``."""
        cwd.mkdir(parents=True, exist_ok=True)
        log = open(self.logs / f"{name}.log", "w")
        p = subprocess.Popen(
            cmd, cwd=cwd, env={**self.env, **(env or {})}, stdout=log, stderr=subprocess.STDOUT, start_new_session=True
        )
        self.procs[name] = (p, log)
        return p

    def log(self, name: str) -> str:
        return (self.logs / f"{name}.log").read_text(errors="replace")

    def stop(self, name: str, timeout: float = 30.0) -> None:
        p, log = self.procs.pop(name)
        for sig, wait in ((signal.SIGTERM, timeout), (signal.SIGKILL, 10.0)):
            if p.poll() is not None:
                break
            try:
                os.killpg(p.pid, sig)
            except ProcessLookupError:
                break
            try:
                p.wait(wait)
            except subprocess.TimeoutExpired:
                continue
        try:  # children left in the session (SuperExec, ClientApp/ServerApp processes)
            os.killpg(p.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
        log.close()

    def stop_all(self) -> None:
        for name in [n for n in self.procs if n.startswith("node")] + [
            n for n in self.procs if not n.startswith("node")
        ]:
            self.stop(name)


def kill_by_env(name: str, value: str, spare_sessions: set[int] | frozenset[int] = frozenset()) -> list[int]:
    """SIGKILL every process of this user whose environment has ``name=value`` (a run's own
    FLWR_HOME, say): Flower's SuperExec starts the ServerApp and the simulation in processes that
    leave the SuperLink's session, so killing the session does not reach them. Processes in the
    sessions ``spare_sessions`` (session leaders' pids: SuperNodes that must live on) are left."""
    wanted = f"{name}={value}".encode()
    killed = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit() or int(entry.name) == os.getpid():
            continue
        try:
            if os.getsid(int(entry.name)) in spare_sessions:
                continue
            if wanted in (entry / "environ").read_bytes().split(b"\0"):
                os.kill(int(entry.name), signal.SIGKILL)
                killed.append(int(entry.name))
        except (OSError, ProcessLookupError):
            continue
    return killed


def wait_healthy(url: str, limit: float = 60.0, why: str = "") -> None:
    """Poll ``url`` (a SuperLink's plain HTTP ``/health``) until it answers 200; fail after ``limit`` s."""
    deadline = time.monotonic() + limit
    while True:
        try:
            with urllib.request.urlopen(url, timeout=2) as r:
                if r.status == 200:
                    return
        except OSError:
            pass
        assert time.monotonic() < deadline, f"{url} did not answer within {limit:.0f} s\n{why}"
        time.sleep(0.3)


def flwr_run(
    env: dict[str, str], app: Path, connection: str, run_config: str, cwd: Path, timeout: float = 900.0
) -> tuple[str, str]:
    """``flwr run APP CONNECTION --stream --run-config …``; returns (run id, output) after checking
    that it exited 0 and that Flower reports the run ``finished:completed`` (``flwr run`` exits 0
    even when the ServerApp failed)."""
    import json
    import re
    import sys

    flwr = str(Path(sys.executable).parent / "flwr")
    run = subprocess.run(
        [flwr, "run", str(app), connection, "--stream", "--run-config", run_config],
        env=env, cwd=cwd, capture_output=True, text=True, timeout=timeout,
    )  # fmt: skip
    log = run.stdout + run.stderr
    started = re.search(r"Successfully started run (\d+)", log)
    assert run.returncode == 0 and started, log[-4000:]
    info = subprocess.run(
        [flwr, "ls", connection, "--run-id", started.group(1), "--format", "json"],
        env=env, cwd=cwd, capture_output=True, text=True, timeout=60,
    )  # fmt: skip
    assert json.loads(info.stdout)["runs"][0]["status"] == "finished:completed", log[-6000:]
    return started.group(1), log
