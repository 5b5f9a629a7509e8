"""A user's own local training (``client.local_update``), hostile on purpose: whatever the hook
does to the model — blow it up, make it NaN, raise, or read the batches it is given — each user's
contribution is still isolated and clipped, so the guarantee does not depend on the hook."""

from __future__ import annotations

import json
import math
import subprocess
import sys
import textwrap

import pytest

ROOT = __import__("pathlib").Path(__file__).resolve().parents[2]


def _script(out: str) -> str:
    return textwrap.dedent(
        f"""
        import json, math, torch
        import fedsim

        def adam(model, batches, loss, spec):
            opt = torch.optim.Adam(model.parameters(), lr=0.05)
            total, n = 0.0, 0
            for x, y in batches:
                opt.zero_grad(); l = loss(model(x), y); l.backward(); opt.step()
                total, n = total + float(l), n + 1
            return total / max(n, 1)

        seen_users = set()

        def hostile(model, batches, loss, spec):
            ys = [y for _, y in batches]
            with torch.no_grad():
                p = next(model.parameters())
                k = int(sum(int(y.sum()) for y in ys)) % 3
                if k == 0:
                    p.add_(1e30)          # huge: clipped to c
                elif k == 1:
                    p.fill_(float("nan"))  # not finite: contributes zero, counted
                else:
                    raise RuntimeError("the hook fails")  # contributes zero, counted
            return 0.0

        fedsim.register_local_update("my_adam", adam)
        fedsim.register_local_update("hostile", hostile)
        base = {{"rounds": 3, "data": {{"name": "synthetic", "num_clients": 20}}, "model": {{"name": "logreg"}},
                "sampling": {{"scheme": "poisson", "cohort_size": 8}}, "privacy": {{"mechanism": "none"}},
                "eval": {{"every": 0}}, "sim": {{"engine": "inprocess", "num_workers": 1}}}}
        out = {{}}
        for name in ("my_adam", "hostile"):
            cfg = dict(base, client={{"local_update": name, "clip_norm": 0.5}})
            r = fedsim.run(cfg, "{out}/" + name)
            from fedsim.runner.build import prepare
            x0 = prepare(fedsim.load_config(cfg)).x0
            moved = float((r.final_parameters.double() - x0.double()).norm())
            out[name] = {{"rows": r.metrics, "moved": moved}}
        print(json.dumps(out))
        """
    )


def test_a_hostile_hook_is_isolated_and_clipped(tmp_path):
    r = subprocess.run([sys.executable, "-c", _script(str(tmp_path))], capture_output=True, text=True,
                       cwd=tmp_path, timeout=600)  # fmt: skip
    assert r.returncode == 0, r.stderr[-3000:]
    got = json.loads(r.stdout.strip().splitlines()[-1])
    good = got["my_adam"]["rows"]
    assert len(good) == 3 and all(math.isfinite(row["train_loss"]) for row in good)
    bad = got["hostile"]["rows"]
    assert len(bad) == 3
    failed = sum(row["failed_users"] for row in bad)
    nonfinite = sum(row["nonfinite_users"] for row in bad)
    clipped = sum(row["clipped_fraction"] * row["accepted_updates"] for row in bad)
    assert failed > 0 and nonfinite > 0 and clipped > 0
    # no noise (mechanism none): the model moves by the clipped sums over K̄ = 8 alone, at most
    # (users accepted) · c / K̄ a round, however large the hook made an update (1e30)
    bound = sum(row["accepted_updates"] for row in bad) * 0.5 / 8
    assert 0 < got["hostile"]["moved"] <= bound * (1 + 1e-5)


def test_an_unregistered_hook_is_refused_with_the_registered_names():
    import fedsim

    with pytest.raises(fedsim.FedsimError, match="client.local_update = 'nope' is unknown"):
        fedsim.load_config(None, ["client.local_update='nope'"])
