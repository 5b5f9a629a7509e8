"""A Stack Overflow-sized population (342,477 users) with a tiny model: nothing is allocated
per user up front beyond O(N) counts, so a few rounds stay within a fixed memory bound.

The peak is the child's ``VmHWM`` (this process image's high-water mark), not
``ru_maxrss``: Linux carries ``ru_maxrss`` across ``exec`` from the forking parent, so a child
of a large pytest process would report the parent's peak."""

from __future__ import annotations

import json
import subprocess
import sys

N = 342_477

CODE = """
import json
from fedsim.config import load_config
from fedsim.runner import run_experiment
cfg = load_config(None, ['data.name="synthetic"', 'data.num_clients={n}', 'model.name="logreg"', 'rounds=3',
                         'sampling.scheme="poisson"', 'sampling.cohort_size=50', 'privacy.mechanism="gaussian"',
                         'privacy.noise_multiplier=1.0', 'eval.every=0', 'eval.max_users=20', 'sim.num_workers=1'])
s = run_experiment(cfg, {out!r}, progress=False)
print(json.dumps({{'population': s['population'], 'engine': s['engine'],
                   'peak_rss_mib': int(next(l for l in open('/proc/self/status') if l.startswith('VmHWM')).split()[1]) / 1024}}))
"""


def test_full_population_run_stays_under_one_gib(tmp_path):
    proc = subprocess.run(
        [sys.executable, "-c", CODE.format(n=N, out=str(tmp_path / "run"))], capture_output=True, text=True, timeout=600
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    res = json.loads(proc.stdout.strip().splitlines()[-1])
    assert res["population"] == N and res["engine"] == "inprocess"
    assert res["peak_rss_mib"] < 1024, res
    rows = [json.loads(line) for line in (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()]
    assert len(rows) == 3 and all(r["accepted_updates"] == r["cohort_size"] for r in rows)
