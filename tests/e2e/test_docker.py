"""The deployment images, built and run: a SuperLink and two SuperNodes from docker/Dockerfile on
a bridge network, with TLS and SuperNode authentication, the certificates exactly as
``fedsim deploy certs`` writes them (0600, owned by the caller), ``flwr run`` from the host, and
the run's ε recomputed from its ledger.

Slow (it builds images). Skipped, with the reason, when no Docker daemon answers or no base image
is at hand: ``FEDSIM_TEST_BASE_IMAGE`` names one, else ``python:3.11.11-slim-bookworm`` or
``fedsim-base:bookworm`` (``docker/base/build-base.sh``) is used when present. The fedsim wheel
and, where pip finds one, torch's CPU wheel go into docker/local/wheels/ first, as ``make images``
does.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

import pytest

from e2e.processes import flwr_run, free_port
from fedsim.privacy.ledger import recompute_epsilon

pytestmark = pytest.mark.slow

ROOT = Path(__file__).resolve().parents[2]
BIN = Path(sys.executable).parent
TAG = "fedsim-test"
SET = "rounds=2;eval.max_users=8;eval.max_examples_per_user=4;client.max_examples=16"


def _docker(*args: str, timeout: float = 120.0, check: bool = True) -> subprocess.CompletedProcess:
    r = subprocess.run(["docker", *args], capture_output=True, text=True, timeout=timeout)
    if check:
        assert r.returncode == 0, f"docker {' '.join(args)}\n{r.stdout[-3000:]}\n{r.stderr[-3000:]}"
    return r


def _base_image() -> str:
    if shutil.which("docker") is None:
        pytest.skip("no docker command (README 'Docker': apt-get install docker.io, then start dockerd)")
    if subprocess.run(["docker", "info"], capture_output=True, timeout=60).returncode != 0:
        pytest.skip("no Docker daemon answers (start dockerd)")
    wanted = [os.environ.get("FEDSIM_TEST_BASE_IMAGE"), "python:3.11.11-slim-bookworm", "fedsim-base:bookworm"]
    for image in [w for w in wanted if w]:
        if subprocess.run(["docker", "image", "inspect", image], capture_output=True).returncode == 0:
            return image
    pytest.skip("no base image: pull python:3.11.11-slim-bookworm or run docker/base/build-base.sh")


@pytest.fixture(scope="module")
def images():
    base = _base_image()
    local = ROOT / "docker" / "local" / "wheels"
    local.mkdir(parents=True, exist_ok=True)
    for old in local.glob("fedsim-*.whl"):
        old.unlink()
    pip = [sys.executable, "-m", "pip"]
    subprocess.run([*pip, "wheel", "-q", "--no-deps", "--no-build-isolation", "-w", str(local), str(ROOT)], check=True)
    if not list(local.glob("torch-2.13.0*.whl")):  # the local pip's CPU wheel, if it has one
        subprocess.run([*pip, "download", "-q", "--no-deps", "--only-binary=:all:", "-d", str(local), "torch==2.13.0"])
    t0 = time.monotonic()
    built = {}
    for role in ("superlink", "supernode"):
        tag = f"{TAG}-{role}:latest"
        _docker(
            "build", "-f", str(ROOT / "docker" / "Dockerfile"), "--target", role, "--build-arg",
            f"BASE_IMAGE={base}", "-t", tag, str(ROOT), timeout=3600,
        )  # fmt: skip
        built[role] = tag
    seconds = time.monotonic() - t0
    sizes = {r: int(_docker("image", "inspect", "-f", "{{.Size}}", t).stdout) for r, t in built.items()}
    print(f"\ndocker: built {sorted(built)} on {base} in {seconds:.0f} s; sizes {sizes}")
    return built


def test_a_tls_authenticated_federation_from_the_images(images, tmp_path):
    env_bin = f"{BIN}{os.pathsep}{os.environ.get('PATH', '')}"
    certs = tmp_path / "certs"
    subprocess.run(
        [str(BIN / "fedsim"), "deploy", "certs", "--out", str(certs), "--host", "superlink", "--host", "127.0.0.1", "--nodes", "2"],
        check=True, capture_output=True,
    )  # fmt: skip
    assert oct((certs / "server.key").stat().st_mode & 0o777) == "0o600"  # as written, no chown
    port = free_port()
    home = tmp_path / "flwr_home"
    home.mkdir()
    (home / "config.toml").write_text(
        f'[superlink]\ndefault = "docker"\n\n[superlink.docker]\naddress = "127.0.0.1:{port}"\n'
        f'root-certificates = "{certs / "ca.pem"}"\n'
    )
    env = {**os.environ, "FLWR_HOME": str(home), "FLWR_TELEMETRY_ENABLED": "0", "PATH": env_bin}
    net = f"{TAG}-net-{port}"
    names = [f"{TAG}-link-{port}", *(f"{TAG}-node{i}-{port}" for i in range(2))]
    volumes = [f"{TAG}-state-{port}", f"{TAG}-runs-{port}"]
    _docker("network", "create", net)
    t0 = time.monotonic()
    try:
        _docker(
            "run", "-d", "--name", names[0], "--network", net, "--network-alias", "superlink",
            "-p", f"127.0.0.1:{port}:8000",
            "-v", f"{certs / 'ca.pem'}:/secrets/ca.pem:ro", "-v", f"{certs / 'server.pem'}:/secrets/server.pem:ro",
            "-v", f"{certs / 'server.key'}:/secrets/server.key:ro",
            "-v", f"{volumes[0]}:/state", "-v", f"{volumes[1]}:/runs",
            images["superlink"],
            "--ssl-ca-certfile=/certs/ca.pem", "--ssl-certfile=/certs/server.pem", "--ssl-keyfile=/certs/server.key",
            "--enable-supernode-auth", "--disable-runtime-dependency-installation", "--isolation=subprocess",
            "--database=/state/superlink.db", "--host=0.0.0.0", "--port=8000", "--health-server-address=127.0.0.1:9098",
        )  # fmt: skip
        deadline = time.monotonic() + 120
        while _docker("inspect", "-f", "{{.State.Health.Status}}", names[0]).stdout.strip() != "healthy":
            assert time.monotonic() < deadline, _docker("logs", names[0], check=False).stdout[-3000:]
            time.sleep(2)
        for i in range(2):
            reg = subprocess.run(
                [str(BIN / "flwr"), "supernode", "register", str(certs / f"node-{i}.pub"), "docker", "--format", "json"],
                env=env, capture_output=True, text=True, timeout=60,
            )  # fmt: skip
            assert reg.returncode == 0 and json.loads(reg.stdout)["success"], reg.stdout + reg.stderr
            _docker(
                "run", "-d", "--name", names[1 + i], "--network", net,
                *(a for f in ("ca.pem", f"node-{i}", f"node-{i}-tls.pem", f"node-{i}-tls.key")
                  for a in ("-v", f"{certs / f}:/secrets/{f}:ro")),
                images["supernode"],
                "--superlink=superlink:8000", "--root-certificates=/certs/ca.pem",
                f"--auth-supernode-private-key=/certs/node-{i}", f'--node-config=user-shard="{i}/2"',
                "--isolation=subprocess", f"--ssl-certfile=/certs/node-{i}-tls.pem",
                f"--ssl-keyfile=/certs/node-{i}-tls.key", "--ssl-ca-certfile=/certs/ca.pem",
                "--health-server-address=127.0.0.1:9098",
            )  # fmt: skip
        flwr_run(env, ROOT, "docker", f'set="{SET}" out-dir="/runs/trial" min-nodes=2', ROOT, 1200)
        got = tmp_path / "got"
        _docker("cp", f"{names[0]}:/runs/trial", str(got))
        summary = json.loads((got / "summary.json").read_text())
        ledger = json.loads((got / "ledger.json").read_text())
        assert summary["rounds_completed"] == 2 and summary["engine"] == "deployment"
        assert summary["population"] == 848  # the two nodes' shards: every Shakespeare user, held once
        assert summary["epsilon"] == pytest.approx(recompute_epsilon(ledger), rel=1e-12)
        print(f"docker: federation up and a 2-round flwr run finished in {time.monotonic() - t0:.0f} s")
    finally:
        for name in names:
            _docker("rm", "-f", name, check=False)
        _docker("network", "rm", net, check=False)
        _docker("volume", "rm", *volumes, check=False)
