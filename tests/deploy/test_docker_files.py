"""The Docker files, checked without a Docker engine (the images themselves are built and run by
the slow ``tests/e2e/test_docker.py``): hadolint, the one multi-target Dockerfile's rules, the
entrypoint, ``.dockerignore`` and the compose file, service by service."""

from __future__ import annotations

import re
import shutil
import subprocess
import sys
from pathlib import Path

import yaml

ROOT = Path(__file__).resolve().parents[2]
DOCKER = ROOT / "docker"
DOCKERFILE = DOCKER / "Dockerfile"


def test_one_dockerfile_with_a_target_per_role():
    assert sorted(p.name for p in DOCKER.glob("Dockerfile*")) == ["Dockerfile"]
    targets = re.findall(r"^FROM \S+ AS (\S+)", DOCKERFILE.read_text(), re.M)
    assert targets == ["install", "runtime", "superexec", "supernode", "superlink"]


def test_hadolint_passes():
    exe = shutil.which("hadolint") or str(Path(sys.executable).parent / "hadolint")
    proc = subprocess.run([exe, "--failure-threshold", "info", str(DOCKERFILE)], capture_output=True, text=True)
    assert proc.returncode == 0, proc.stdout + proc.stderr


def test_the_dockerfile_pins_installs_runtime_dependencies_only_and_checks_health():
    text = DOCKERFILE.read_text()
    assert re.search(r"^ARG BASE_IMAGE=python:\d+\.\d+\.\d+-slim-bookworm$", text, re.M)
    assert re.search(r"^ARG TORCH_INDEX_URL=", text, re.M)
    assert "torch==2.13.0" in text and "-c /tmp/requirements/lock.txt" in text
    assert "-r " not in text  # the lock file constrains; it never installs its dev tools
    assert "HEALTHCHECK" in text and "--insecure" not in text
    for copied in re.findall(r"^COPY (?!--from)(\S+)", text, re.M):
        assert (ROOT / copied.rstrip("/")).exists() or copied.startswith("docker/local"), copied
    assert "chown 10001:10001 /state /runs /certs" in text  # writable state for named volumes


def test_the_entrypoint_drops_to_the_service_user_after_copying_the_secrets():
    text = (DOCKER / "entrypoint.sh").read_text()
    assert "cp -rL /secrets/. /certs/" in text and "chmod 600" in text
    assert 'exec setpriv --reuid=10001 --regid=10001 --init-groups "$role" "$@"' in text
    proc = subprocess.run(["sh", "-n", str(DOCKER / "entrypoint.sh")], capture_output=True, text=True)
    assert proc.returncode == 0, proc.stderr


def test_the_build_context_leaves_out_git_the_venv_and_keys():
    lines = [ln.strip() for ln in (ROOT / ".dockerignore").read_text().splitlines() if ln.strip()]
    lines = [ln for ln in lines if not ln.startswith("#")]
    assert lines[0] == "*"  # everything is out unless named
    allowed = {ln[1:] for ln in lines if ln.startswith("!")}
    assert not any(a.startswith((".git", ".venv", "docker/certs", "runs")) for a in allowed)


def _compose() -> dict:
    return yaml.safe_load((DOCKER / "compose.yaml").read_text())


def test_compose_has_one_superlink_and_three_supernodes_all_tls_and_authenticated():
    c = _compose()
    assert "name" not in c  # Compose v1 refuses a top-level name
    services = c["services"]
    assert set(services) == {"superlink", "supernode-0", "supernode-1", "supernode-2"}
    assert "--insecure" not in (DOCKER / "compose.yaml").read_text()
    link = services["superlink"]
    assert link["image"].startswith("fedsim-superlink:")
    cmd = link["command"]
    for flag in (
        "--ssl-ca-certfile=/certs/ca.pem",
        "--ssl-certfile=/certs/server.pem",
        "--ssl-keyfile=/certs/server.key",
        "--enable-supernode-auth",
        "--disable-runtime-dependency-installation",
        "--database=/state/superlink.db",
    ):
        assert flag in cmd
    port = next(a.split("=")[1] for a in cmd if a.startswith("--port="))
    assert f"{port}:{port}" in link["ports"]
    mounted = {v.split(":")[1] for v in link["volumes"]}
    assert {"/secrets/ca.pem", "/secrets/server.pem", "/secrets/server.key", "/runs", "/state"} <= mounted
    data_volumes = set()
    for i in range(3):
        node = services[f"supernode-{i}"]
        assert node["image"].startswith("fedsim-supernode:")
        cmd = node["command"]
        assert f"--superlink=superlink:{port}" in cmd and "--root-certificates=/certs/ca.pem" in cmd
        assert f"--auth-supernode-private-key=/certs/node-{i}" in cmd
        assert f"--ssl-certfile=/certs/node-{i}-tls.pem" in cmd and f"--ssl-keyfile=/certs/node-{i}-tls.key" in cmd
        assert any(
            a.startswith("--node-config=") and f'user-shard="{i}/3"' in a and 'data-root="/data"' in a for a in cmd
        )
        vols = node["volumes"]
        assert f"./certs/node-{i}:/secrets/node-{i}:ro" in vols and "./certs/ca.pem:/secrets/ca.pem:ro" in vols
        data = [v for v in vols if v.split(":")[1] == "/data"]
        assert len(data) == 1 and data[0].endswith(":ro")
        data_volumes.add(data[0].split(":")[0])
        assert node["depends_on"]["superlink"]["condition"] == "service_healthy"
        assert not any(v.split(":")[0].endswith(("server.key", "ca.key")) for v in vols)  # no server secrets
        others = {f"node-{j}" for j in range(3) if j != i}
        assert not any(Path(v.split(":")[0]).name.split("-tls")[0] in others for v in vols)  # no other node's key
    assert len(data_volumes) == 3 and data_volumes <= set(c["volumes"])
    for s in services.values():
        for v in s["volumes"]:
            src = v.split(":")[0]
            if src.startswith("./"):
                assert src.startswith("./certs/")  # generated by `fedsim deploy certs --out docker/certs`
