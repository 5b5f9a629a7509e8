"""Keys added to the config after checkpoints began to carry a privacy digest must not change the
digest of a config that leaves them at their "as before" value: a run folder written by an
earlier fedsim (without the key) resumes, instead of being refused as altered."""

from __future__ import annotations

import hashlib
import json

from fedsim.config import load_config
from fedsim.runner.resume import _LATER_KEYS, _flat, forceable, privacy_digest


def test_new_keys_at_their_defaults_leave_the_digest_as_an_older_fedsim_computed_it():
    cfg = load_config(None, [])
    flat = _flat(cfg.model_dump(mode="json"))
    for key in ("plugins", "client.local_update", "clipping.mode", "privacy.population"):
        assert key in _LATER_KEYS and flat.get(key) == _LATER_KEYS[key]
    older = {k: v for k, v in flat.items() if not forceable(k) and k != "rounds" and k not in _LATER_KEYS}
    assert privacy_digest(cfg) == hashlib.sha256(json.dumps(older, sort_keys=True).encode()).hexdigest()
