"""A real deployed federation on 127.0.0.1 for the end-to-end tests and ``benchmarks/deploy_memory.py``:
one ``flower-superlink`` with TLS and SuperNode authentication (certificates from
``fedsim deploy certs``'s :func:`~fedsim.deploy.certs.make_all`), ``flower-supernode`` processes with
registered keys and their own data folders, ``flwr`` against it through a ``$FLWR_HOME``
connection, and a supervisor that restarts a SuperNode when it exits. Every process is in its
own session (:class:`~e2e.processes.Processes`); :meth:`Federation.close` stops them all, the
ServerApp processes that leave the SuperLink's session included, and waits for the ports.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import signal
import ssl
import subprocess
import sys
import tempfile
import threading
import time
import urllib.request
from pathlib import Path

from e2e.processes import Processes, free_port, kill_by_env, port_free
from fedsim.deploy.certs import make_all

ROOT = Path(__file__).resolve().parents[2]
BIN = Path(sys.executable).parent
CONN = "fedsim-test"


def remove_ray_tmp(env: dict[str, str]) -> None:
    shutil.rmtree(env["RAY_TMPDIR"], ignore_errors=True)


def flower_env(tmp: Path) -> dict[str, str]:
    """The environment of every Flower process: its own ``FLWR_HOME`` and temp folders, no
    telemetry or update check, one thread per process, no network for Hugging Face. Ray's temp
    folder is a short one under the system's (Ray's socket paths must stay under 108 bytes);
    remove it with :func:`remove_ray_tmp`."""
    home = tmp / "flwr_home"
    home.mkdir(parents=True, exist_ok=True)
    ray = tempfile.mkdtemp(prefix="fedsim-ray-")
    return {
        **os.environ,
        "FLWR_HOME": str(home),
        "RAY_TMPDIR": ray,
        "FLWR_TELEMETRY_ENABLED": "0",
        "FLWR_DISABLE_UPDATE_CHECK": "1",
        "OMP_NUM_THREADS": "1",
        "HF_HUB_OFFLINE": "1",
        "HF_DATASETS_OFFLINE": "1",
        "FEDSIM_CACHE": str(tmp / "cache"),
        "PATH": f"{BIN}{os.pathsep}{os.environ.get('PATH', '')}",
    }


class Federation:
    """Certificates for ``nodes`` SuperNodes, a ``$FLWR_HOME`` whose default connection
    ``fedsim-test`` is the SuperLink's TLS address, and the processes started on it.

    Parameters
    ----------
    tmp : a fresh folder (certificates, logs, Flower home, the processes' working folders).
    nodes : how many node key pairs and TLS certificates to make.
    """

    def __init__(self, tmp: Path, nodes: int) -> None:
        self.tmp, self.nodes = tmp, nodes
        self.certs = tmp / "certs"
        make_all(self.certs, ["localhost", "127.0.0.1"], nodes=nodes)
        self.env = flower_env(tmp)
        (tmp / "logs").mkdir(exist_ok=True)
        self.procs = Processes(self.env, tmp / "logs")
        self.link_port = free_port()
        self.ports: list[int] = [self.link_port]
        self.supervisor: Supervisor | None = None
        (tmp / "flwr_home" / "config.toml").write_text(
            f'[superlink]\ndefault = "{CONN}"\n\n[superlink.{CONN}]\n'
            f'address = "127.0.0.1:{self.link_port}"\nroot-certificates = "{self.certs / "ca.pem"}"\n'
        )

    # ---------------------------------------------------------------- SuperLink
    def start_superlink(self, database: Path | None = None, name: str = "superlink") -> None:
        """Start the SuperLink (TLS, node authentication, ``--isolation subprocess``; its state in
        ``database`` when given, else in memory) and wait until its HTTPS health check answers."""
        c = self.certs
        cmd = [
            str(BIN / "flower-superlink"),
            *("--ssl-ca-certfile", str(c / "ca.pem"), "--ssl-certfile", str(c / "server.pem")),
            *("--ssl-keyfile", str(c / "server.key"), "--enable-supernode-auth"),
            *("--disable-runtime-dependency-installation", "--isolation", "subprocess"),
            *("--host", "127.0.0.1", "--port", str(self.link_port)),
            *(("--database", str(database)) if database is not None else ()),
        ]
        self.procs.start(name, cmd, self.tmp / name)
        ctx = ssl.create_default_context(cafile=str(c / "ca.pem"))
        deadline = time.monotonic() + 60
        while True:
            try:
                with urllib.request.urlopen(f"https://127.0.0.1:{self.link_port}/health", context=ctx, timeout=2) as r:
                    if r.status == 200:
                        return
            except OSError:
                pass
            assert time.monotonic() < deadline, self.procs.log(name)[-3000:]
            time.sleep(0.3)

    def kill_superlink(self, name: str = "superlink") -> list[int]:
        """SIGKILL the SuperLink's session and every process under this ``FLWR_HOME`` that is not
        a SuperNode's (the ServerApp leaves the SuperLink's session); returns the latter's pids."""
        p, log = self.procs.procs.pop(name)
        os.killpg(p.pid, signal.SIGKILL)
        p.wait(10)
        log.close()
        others = {q.pid for q, _ in self.procs.procs.values()}  # the SuperNodes (and SuperExecs) live on
        return kill_by_env("FLWR_HOME", self.env["FLWR_HOME"], spare_sessions=others)

    # ---------------------------------------------------------------- SuperNodes
    def flwr(self, *args: str, timeout: float = 120.0) -> subprocess.CompletedProcess:
        return subprocess.run(
            [str(BIN / "flwr"), *args], env=self.env, cwd=ROOT, capture_output=True, text=True, timeout=timeout
        )

    def register(self, i: int) -> None:
        reg = self.flwr("supernode", "register", str(self.certs / f"node-{i}.pub"), CONN, "--format", "json")
        assert reg.returncode == 0 and json.loads(reg.stdout)["success"], reg.stdout + reg.stderr

    def supernode_cmd(self, extra: list[str], port: int | None = None) -> list[str]:
        """``flower-supernode`` against this SuperLink, its Runtime API on a fresh port."""
        if port is None:
            port = free_port()
            self.ports.append(port)
        return [
            str(BIN / "flower-supernode"),
            *("--superlink", f"127.0.0.1:{self.link_port}", "--host", "127.0.0.1", "--port", str(port)),
            *extra,
        ]

    def node_args(self, i: int, data_root: Path, max_retries: int | None = 10, node_config: str = "") -> list[str]:
        """The flags of registered node ``i``: the CA, its key, its data (and ``node_config``'s
        further ``key="value"`` pairs), TLS on its Runtime API."""
        c = self.certs
        return [
            *("--root-certificates", str(c / "ca.pem"), "--auth-supernode-private-key", str(c / f"node-{i}")),
            *("--node-config", f'data-root="{data_root}" {node_config}'.strip()),
            *("--ssl-certfile", str(c / f"node-{i}-tls.pem"), "--ssl-keyfile", str(c / f"node-{i}-tls.key")),
            *("--ssl-ca-certfile", str(c / "ca.pem")),
            *(("--max-retries", str(max_retries)) if max_retries is not None else ()),
        ]

    def start_node(
        self,
        i: int,
        data_root: Path,
        max_retries: int | None = 10,
        isolation: str = "subprocess",
        node_config: str = "",
        env: dict[str, str] | None = None,
    ) -> None:
        """Start registered node ``i`` as ``node-i`` (``node_config``: further node config pairs;
        ``env``: changes to its environment). ``isolation = "process"``: the SuperNode runs no
        SuperExec of its own; a ``flower-superexec`` (``superexec-i``) connects to its Runtime API
        over TLS and starts the ClientApp processes."""
        port = free_port()
        self.ports.append(port)
        extra = self.node_args(i, data_root, max_retries, node_config) + ["--isolation", isolation]
        self.procs.start(f"node-{i}", self.supernode_cmd(extra, port), self.tmp / f"node-{i}", env)
        if isolation == "process":
            cmd = [
                str(BIN / "flower-superexec"),
                *("--runtime-api-address", f"127.0.0.1:{port}", "--root-certificates", str(self.certs / "ca.pem")),
            ]
            self.procs.start(f"superexec-{i}", cmd, self.tmp / f"node-{i}")

    def kill_node(self, i: int) -> None:
        """SIGKILL node ``i``'s whole session (the SuperNode, its SuperExec and ClientApps), as a
        crashed host would lose them: no goodbye reaches the SuperLink."""
        p, log = self.procs.procs.pop(f"node-{i}")
        os.killpg(p.pid, signal.SIGKILL)
        p.wait(10)
        log.close()

    def online(self) -> list[dict]:
        ls = self.flwr("supernode", "list", CONN, "--format", "json")
        return [n for n in json.loads(ls.stdout)["nodes"] if n["status"] == "online"] if ls.returncode == 0 else []

    def wait_online(self, count: int, limit: float = 180.0) -> None:
        deadline = time.monotonic() + limit
        while len(self.online()) < count:
            assert time.monotonic() < deadline, f"fewer than {count} nodes online\n{self.procs.log('node-0')[-2000:]}"
            time.sleep(1)

    # ---------------------------------------------------------------- runs
    def run(self, run_config: str, timeout: float = 900.0) -> tuple[str, str]:
        """``flwr run . fedsim-test --stream`` with ``run_config``; returns (run id, output) after
        checking that Flower reports the run ``finished:completed``."""
        run = self.flwr("run", str(ROOT), CONN, "--stream", "--run-config", run_config, timeout=timeout)
        log = run.stdout + run.stderr
        started = re.search(r"Successfully started run (\d+)", log)
        assert run.returncode == 0 and started, log[-4000:]
        assert self.status(started.group(1)) == "finished:completed", log[-6000:]
        return started.group(1), log

    def start_run(self, run_config: str) -> subprocess.Popen:
        """``flwr run … --stream`` in the background (its output is not kept)."""
        return subprocess.Popen(
            [str(BIN / "flwr"), "run", str(ROOT), CONN, "--stream", "--run-config", run_config],
            env=self.env,
            cwd=ROOT,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
            start_new_session=True,
        )

    def status(self, run_id: str) -> str:
        info = self.flwr("ls", CONN, "--run-id", run_id, "--format", "json", timeout=60)
        return json.loads(info.stdout)["runs"][0]["status"] if info.returncode == 0 else info.stderr

    def close(self) -> None:
        """Stop the supervisor and every process; check that every port is free again."""
        if self.supervisor is not None:
            self.supervisor.stop()
        self.procs.stop_all()
        kill_by_env("FLWR_HOME", self.env["FLWR_HOME"])
        remove_ray_tmp(self.env)
        for port in self.ports:
            deadline = time.monotonic() + 20
            while not port_free(port) and time.monotonic() < deadline:
                time.sleep(0.2)
            assert port_free(port), f"port {port} still in use after shutdown"


def wait_rows(path: Path, rows: int, limit: float = 600.0, alive: subprocess.Popen | None = None) -> None:
    """Wait until ``metrics.jsonl`` at ``path`` has ``rows`` rows (``alive``: a process that must not exit first)."""
    deadline = time.monotonic() + limit
    while not path.exists() or len(path.read_text().splitlines()) < rows:
        assert time.monotonic() < deadline, f"{path}: fewer than {rows} rows after {limit:.0f} s"
        assert alive is None or alive.poll() is None, f"the run ended before {path} had {rows} rows"
        time.sleep(0.2)


class Supervisor:
    """Restart each watched SuperNode ``delay`` seconds after its process exits, as systemd's
    ``Restart=always`` with ``RestartSec`` would (a thread polling every 0.5 s).

    Parameters
    ----------
    fed : the federation whose nodes it watches.
    nodes : ``{i: data_root}`` of the nodes to keep running (started here).
    delay : the restart delay, seconds.
    """

    def __init__(self, fed: Federation, nodes: dict[int, Path], delay: float) -> None:
        self.fed, self.nodes, self.delay = fed, nodes, delay
        self.restarts: list[tuple[float, int]] = []
        self._stop = threading.Event()
        self._lock = threading.Lock()
        for i, root in nodes.items():
            fed.start_node(i, root, max_retries=None)
        fed.supervisor = self
        self._thread = threading.Thread(target=self._watch, daemon=True)
        self._thread.start()

    def _watch(self) -> None:
        exited: dict[int, float] = {}
        while not self._stop.wait(0.5):
            with self._lock:
                for i, root in self.nodes.items():
                    entry = self.fed.procs.procs.get(f"node-{i}")
                    if entry is not None and entry[0].poll() is None:
                        continue
                    t = exited.setdefault(i, time.monotonic())
                    if time.monotonic() - t >= self.delay:
                        if entry is not None:
                            self.fed.procs.stop(f"node-{i}")
                        log = self.fed.tmp / "logs" / f"node-{i}.log"
                        if log.exists():  # keep each life's log
                            log.rename(log.with_name(f"node-{i}.{len(self.restarts)}.log"))
                        self.fed.start_node(i, root, max_retries=None)
                        self.restarts.append((time.monotonic(), i))
                        del exited[i]

    def stop(self) -> None:
        self._stop.set()
        self._thread.join()
