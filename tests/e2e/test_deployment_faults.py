"""Deployment under faults, with real processes: a ``flower-superlink`` with TLS and SuperNode
authentication and real ``flower-supernode``s (``e2e.federation``), each node with its own
generated Stack Overflow folder (disjoint users).

- Nodes SIGKILLed between a round's training and its evaluation: that evaluation has failed
  replies (the round is checkpointed with them before its row is written), and every later round
  counts each lost node once (``client_error`` or ``missing``, never ``unexpected_users``), drops
  exactly the users those nodes hold, and keeps K̄.
- The SuperLink (and its ServerApp) SIGKILLed mid-run with 8 supervised SuperNodes: the SuperLink
  restarts on its ``--database``, the nodes come back, and ``flwr run … resume=true`` finishes the
  run on the Deployment Engine.
"""

from __future__ import annotations

import json
import threading
import time
from pathlib import Path

import pytest

from e2e.federation import Federation, Supervisor, wait_rows
from fedsim.checkpoint import load_checkpoint
from fedsim.data.stackoverflow.synthetic import generate
from fedsim.privacy.ledger import recompute_epsilon

pytestmark = [pytest.mark.deployment, pytest.mark.slow]

#: every user in every round (one epoch group), so a round's drops are exactly the lost nodes' users
EVERYONE = "privacy.mechanism='sqrt';sampling.scheme='epochs';sampling.min_sep=1"
#: a small model and little data per user: the ClientApp processes start in seconds on 2 cores
SMALL = "eval.max_examples_per_user=4;client.max_examples=16"


def _data(tmp: Path, nodes: int, users: int) -> dict[int, Path]:
    return {i: generate(tmp / "data" / f"node-{i}", users=users, per_user=8, first_id=users * i) for i in range(nodes)}


def _rows(out: Path) -> list[dict]:
    return [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]


def _released(out: Path) -> set[int]:
    """Rounds whose model has left the server (the release log's ``model`` events)."""
    path = out / "checkpoint" / "releases.jsonl"
    if not path.exists():
        return set()
    events = [json.loads(line) for line in path.read_text().splitlines() if line.strip()]
    return {int(e["round"]) for e in events if e.get("event") == "model"}


class _RowsAfterCheckpoint:
    """Samples the run folder every 50 ms: the rows in ``metrics.jsonl`` first, then the
    checkpoint's round. A row is written only after its round's checkpoint, so the checkpoint
    read after the rows is never behind them."""

    def __init__(self, out: Path) -> None:
        self.out, self.behind, self.samples = out, [], 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._watch, daemon=True)
        self._thread.start()

    def _watch(self) -> None:
        while not self._stop.wait(0.05):
            path = self.out / "metrics.jsonl"
            if not path.exists():
                continue
            rows = len(path.read_text().splitlines())
            saved = load_checkpoint(self.out / "checkpoint")["metrics_rows"] if rows else 0
            self.samples += 1
            if saved < rows:
                self.behind.append((rows, saved))

    def stop(self) -> None:
        self._stop.set()
        self._thread.join()


def _check_drops(rows: list[dict], lost_users: int, lost_nodes: int, population: int) -> None:
    """Round 1 trained everywhere and lost its evaluation replies from the killed nodes; every
    later round lost each killed node once, as ``client_error`` or ``missing``, with its users."""
    for r in rows:
        reasons = r["drop_reasons"]
        assert r["cohort_size"] == population, r  # K̄ = N, the denominator, never changes
        assert r["eval_failed_replies"] == lost_nodes and r["eval_accuracy"] is not None, r
        assert reasons["unexpected_users"] == 0 and reasons["duplicate"] == 0, r
        if r["round"] == 1:
            assert r["dropped_replies"] == 0 and r["accepted_updates"] == population, r
            continue
        assert r["dropped_replies"] == lost_nodes == reasons["client_error"] + reasons["missing"], r
        assert r["dropped_updates"] == lost_users and r["accepted_updates"] == population - lost_users, r


@pytest.fixture
def faults_federation(tmp_path):
    fed = Federation(tmp_path, nodes=8)
    try:
        yield fed
    finally:
        fed.close()


def test_nodes_killed_between_training_and_evaluation_are_counted_once(faults_federation):
    fed, nodes, users, killed = faults_federation, 4, 6, (1, 3)
    roots = _data(fed.tmp, nodes, users)
    fed.start_superlink()
    for i in range(nodes):
        fed.register(i)
        fed.start_node(i, roots[i])
    fed.wait_online(nodes)
    out = fed.tmp / "run"
    run = fed.start_run(
        f'config="experiments/stackoverflow_nwp_fixture.toml" set="data.root=\'{roots[0]}\';rounds=3;'
        f'{EVERYONE};{SMALL};eval.max_users={nodes * users}" out-dir="{out}" min-nodes={nodes}'
    )
    watch = _RowsAfterCheckpoint(out)
    deadline = time.monotonic() + 600
    while 1 not in _released(out):  # round 1 trained; its model goes to evaluation next
        assert time.monotonic() < deadline and run.poll() is None, fed.procs.log("superlink")[-3000:]
        time.sleep(0.02)
    for i in killed:
        fed.kill_node(i)
    t_kill = time.monotonic()
    assert run.wait(900) == 0
    watch.stop()
    rows = _rows(out)
    assert [r["round"] for r in rows] == [1, 2, 3]
    _check_drops(rows, lost_users=users * len(killed), lost_nodes=len(killed), population=nodes * users)
    # Round 1's failed evaluation replies made it irregular: checkpointed (with its row) before the row went out.
    assert watch.samples > 10 and not watch.behind, watch.behind
    ckpt = load_checkpoint(out / "checkpoint")
    assert ckpt["row"]["eval_failed_replies"] == len(killed) and ckpt["metrics_rows"] == 3
    assert (out / "checkpoint" / "checkpoint.pt").stat().st_mtime <= (out / "metrics.jsonl").stat().st_mtime
    summary = json.loads((out / "summary.json").read_text())
    ledger = json.loads((out / "ledger.json").read_text())
    assert summary["rounds_completed"] == 3 and summary["population"] == nodes * users
    assert summary["epsilon"] == pytest.approx(recompute_epsilon(ledger), rel=1e-12)
    print(f"\nfaults: {len(killed)} of {nodes} nodes killed; the run finished {time.monotonic() - t_kill:.0f} s later")


def test_a_supervised_federation_survives_a_superlink_kill_and_resumes(faults_federation):
    """8 SuperNodes under a supervisor (restart 70 s after an exit: a node restarted sooner with
    the same key is refused while the SuperLink still counts it online), the SuperLink on a
    ``--database``. After 2 published rounds of 5 the SuperLink, the ServerApp and one SuperNode
    (a host lost with it) are SIGKILLed; the SuperLink restarts on the same database, the other
    nodes reconnect by themselves, the supervisor brings the killed one back, and ``resume=true``
    finishes the run with every node."""
    fed, nodes, users = faults_federation, 8, 3
    roots = _data(fed.tmp, nodes, users)
    db = fed.tmp / "state" / "superlink.db"
    db.parent.mkdir()
    fed.start_superlink(database=db)
    for i in range(nodes):
        fed.register(i)
    supervisor = Supervisor(fed, roots, delay=70.0)
    fed.wait_online(nodes)
    out = fed.tmp / "run"
    conf = f'config="experiments/stackoverflow_nwp_fixture.toml" out-dir="{out}" min-nodes={nodes}'
    first = fed.start_run(f"{conf} set=\"data.root='{roots[0]}';rounds=5;{EVERYONE};{SMALL};eval.max_users=8\"")
    wait_rows(out / "metrics.jsonl", 2, alive=first)
    t_kill = time.monotonic()
    assert fed.kill_superlink()  # the ServerApp, outside the SuperLink's session, is killed too
    fed.kill_node(0)
    first.wait(30)
    assert len(_rows(out)) < 5
    fed.start_superlink(database=db, name="superlink-2")
    deadline = time.monotonic() + 300
    while not supervisor.restarts:  # the database still counts node 0 online until its heartbeats lapse
        assert time.monotonic() < deadline, "the supervisor did not restart node 0"
        time.sleep(1)
    fed.wait_online(nodes, limit=300)
    t_back = time.monotonic()
    _, log = fed.run(f'resume=true out-dir="{out}" min-nodes={nodes} census-timeout=300')
    rows = _rows(out)
    assert [r["round"] for r in rows] == [1, 2, 3, 4, 5], log[-3000:]
    assert not any(r["dropped_replies"] or r.get("eval_failed_replies") for r in rows), rows
    assert [i for _, i in supervisor.restarts] == [0] and "Failed to activate" not in fed.procs.log("node-0")
    summary = json.loads((out / "summary.json").read_text())
    ledger = json.loads((out / "ledger.json").read_text())
    assert summary["engine"] == "deployment" and summary["rounds_completed"] == 5
    assert [e["round"] for e in ledger["entries"]] == [1, 2, 3, 4, 5]
    assert summary["epsilon"] == pytest.approx(recompute_epsilon(ledger), rel=1e-12)
    print(
        f"\nSuperLink kill: all {nodes} nodes online {t_back - t_kill:.0f} s after the kill "
        f"({len(supervisor.restarts)} node restarts); resumed run finished {time.monotonic() - t_back:.0f} s later"
    )
