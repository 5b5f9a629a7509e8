"""Deployment building blocks without processes: node shards, the census merge, the run
config, the certificates, and the strategy's routing of users to the nodes that hold them."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
from cryptography import x509
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.hazmat.primitives.serialization import load_pem_private_key, load_ssh_private_key, load_ssh_public_key

from fedsim.deploy.certs import make_all
from fedsim.deploy.nodes import NodeView, is_node_local, merge_census, node_data, parse_shard
from fedsim.deploy.runconfig import parse_run_config
from fedsim.errors import FedsimError

ROOT = Path(__file__).resolve().parents[2]


def test_shards_partition_the_users_disjointly_and_completely(tmp_path):
    from fedsim.data import data_spec
    from fedsim.data.stackoverflow.synthetic import generate

    root = generate(tmp_path / "so", users=11, per_user=4, vocab=30, tags=3)
    spec = data_spec("stackoverflow_nwp", root=str(tmp_path / "elsewhere"), vocab_size=20)
    views = [node_data(spec, {"data-root": str(root), "user-shard": f"{i}/3"}) for i in range(3)]
    names = [n for v in views for n in v.names]
    assert sorted(names) == names and len(set(names)) == 11  # contiguous, disjoint, complete
    assert [v.population for v in views] == [4, 4, 3]
    v = views[1]
    assert isinstance(v, NodeView)
    x, _ = v.train_samples(0, np.arange(2))
    x_ref, _ = v.data.train_samples(4, np.arange(2))
    assert (x == x_ref).all() and v.num_train(0) == v.data.num_train(4)
    assert not is_node_local({"partition-id": 0, "num-partitions": 2})  # Flower's simulation keys
    for bad in ("3/3", "x", "1/0", "-1/2"):
        with pytest.raises(FedsimError, match="user-shard"):
            parse_shard(bad)


def _reply(names, dims=None):
    return {
        "names": names,
        "num_train": [10 + i for i in range(len(names))],
        "num_test": [1] * len(names),
        "dims": dims or {"vocab_size": 96},
        "task": "char",
    }


def test_census_orders_users_by_name_and_refuses_a_user_on_two_nodes():
    data, owners = merge_census({7: _reply(["b", "d"]), 3: _reply(["a", "c", "e"])})
    assert data.names == ["a", "b", "c", "d", "e"] and data.population == 5
    assert owners == {0: (3, 0), 1: (7, 0), 2: (3, 1), 3: (7, 1), 4: (3, 2)}
    assert data.num_train(1) == 10 and data.num_train(4) == 12 and data.model_dims() == {"vocab_size": 96}
    with pytest.raises(FedsimError, match="held by node 1 and node 2"):
        merge_census({1: _reply(["a", "b"]), 2: _reply(["b"])})
    # the message names what selects each node's users, so the operator sees which setting to fix
    overlap = {
        1: {**_reply(["a", "b"]), "selection": "user-shard=0/2"},
        2: {**_reply(["b"]), "selection": "user-shard=0/3"},
    }
    with pytest.raises(
        FedsimError,
        match=r"1 user\(s\), 'b' the first, are held by node 1 \(user-shard=0/2\) and node 2 \(user-shard=0/3\)",
    ):
        merge_census(overlap)
    with pytest.raises(FedsimError, match="model dimensions"):
        merge_census({1: _reply(["a"]), 2: _reply(["b"], {"vocab_size": 5})})
    with pytest.raises(FedsimError, match="no SuperNode reported"):
        merge_census({1: _reply([])})


def test_strategy_routes_each_user_to_its_owner_with_local_indices():
    from fedsim.strategies.user_dp import UserLevelDPStrategy

    s = UserLevelDPStrategy.__new__(UserLevelDPStrategy)
    s.owners = {0: (3, 0), 1: (7, 0), 2: (3, 1), 3: (7, 1), 4: (3, 2)}
    plan = s._plan([4, 1, 0], np.ones(5), grid=None)
    assert plan == [(3, [0, 4], [0, 2]), (7, [1], [0])]


def test_run_config_reads_fedsim_keys_and_refuses_unknown(tmp_path):
    cfg, out, nodes, timeout, resume = parse_run_config(
        {"set": "rounds=3; data.max_users=40", "min-nodes": 3, "out-dir": str(tmp_path / "r")}, ROOT
    )
    assert cfg.rounds == 3 and cfg.data.max_users == 40 and nodes == 3 and out == tmp_path / "r" and not resume
    assert cfg.name == "shakespeare_default" and timeout == 600.0
    with pytest.raises(FedsimError, match="unknown key"):
        parse_run_config({"rounds": 3}, ROOT)
    with pytest.raises(FedsimError, match="not available in deployment"):
        parse_run_config(
            {"set": "client.error_feedback='client';privacy.mechanism='gaussian';sampling.scheme='poisson'"}, ROOT
        )
    with pytest.raises(FedsimError, match="no such file"):
        parse_run_config({"config": "nope.toml"}, ROOT)


def test_certificates_chain_to_the_ca_and_keys_load_as_flower_reads_them(tmp_path):
    made = make_all(tmp_path, ["localhost", "127.0.0.1"], nodes=2)
    ca = x509.load_pem_x509_certificate((tmp_path / "ca.pem").read_bytes())
    server = x509.load_pem_x509_certificate((tmp_path / "server.pem").read_bytes())
    server.verify_directly_issued_by(ca)
    san = server.extensions.get_extension_for_class(x509.SubjectAlternativeName).value
    assert san.get_values_for_type(x509.DNSName) == ["localhost"]
    assert [str(a) for a in san.get_values_for_type(x509.IPAddress)] == ["127.0.0.1"]
    assert ca.extensions.get_extension_for_class(x509.BasicConstraints).value.ca
    key = load_pem_private_key((tmp_path / "server.key").read_bytes(), None)
    assert key.public_key().public_numbers() == server.public_key().public_numbers()
    for i in range(2):
        priv = load_ssh_private_key((tmp_path / f"node-{i}").read_bytes(), None)
        assert isinstance(priv, ec.EllipticCurvePrivateKey)  # what flower-supernode requires
        pub = load_ssh_public_key((tmp_path / f"node-{i}.pub").read_bytes())
        assert pub.public_numbers() == priv.public_key().public_numbers()
        assert (tmp_path / f"node-{i}").stat().st_mode & 0o077 == 0
        local = x509.load_pem_x509_certificate((tmp_path / f"node-{i}-tls.pem").read_bytes())
        local.verify_directly_issued_by(ca)  # the node's own Runtime API: not the SuperLink's key
        names = local.extensions.get_extension_for_class(x509.SubjectAlternativeName).value
        assert [str(a) for a in names.get_values_for_type(x509.IPAddress)] == ["127.0.0.1"]
        assert (tmp_path / f"node-{i}-tls.key").stat().st_mode & 0o077 == 0
    assert (tmp_path / "ca.key").stat().st_mode & 0o077 == 0
    assert len(made["node_public_keys"]) == 2
    with pytest.raises(FedsimError, match="nothing was overwritten"):
        make_all(tmp_path, ["localhost"], nodes=1)


def test_resume_in_the_run_config_reads_the_folder_s_checkpointed_config(tmp_path):
    import json

    from fedsim.runner import run_experiment

    out = tmp_path / "r"
    base = "data.name='synthetic';data.num_clients=12;model.name='logreg';eval.every=0;sim.engine='inprocess'"
    cfg, *_ = parse_run_config({"set": base + ";sim.num_workers=1;rounds=3;sampling.min_sep=3"}, ROOT)
    with pytest.raises(FedsimError, match="needs out-dir"):
        parse_run_config({"resume": True}, ROOT)
    with pytest.raises(FedsimError, match="force applies only with resume"):
        parse_run_config({"force": "sim.num_workers"}, ROOT)
    with pytest.raises(FedsimError, match="cannot be resumed"):
        parse_run_config({"resume": True, "out-dir": str(out)}, ROOT)
    run_experiment(cfg, out, progress=False)
    resumed, folder, _, _, resume = parse_run_config(
        {"resume": True, "out-dir": str(out), "config": "ignored.toml", "set": "sim.num_workers=2", "force": "sim.num_workers"},
        ROOT,
    )  # fmt: skip
    assert resume and folder == out and resumed.sim.num_workers == 2
    assert resumed.privacy.model_dump(exclude={"delta"}) == cfg.privacy.model_dump(exclude={"delta"})
    assert resumed.rounds == 3
    with pytest.raises(FedsimError, match="differs from the run's checkpoint"):
        parse_run_config({"resume": True, "out-dir": str(out), "set": "privacy.noise_multiplier=3.0"}, ROOT)

    # a checkpoint written on a Deployment Engine is never resumed in simulation
    from fedsim.checkpoint import load_checkpoint, save_checkpoint

    ckpt = load_checkpoint(out / "checkpoint")
    assert ckpt["engine"] == "inprocess" and len(ckpt["population_sha256"]) == 64
    ckpt.update(engine="deployment", metrics_rows=1)
    save_checkpoint(out / "checkpoint", ckpt)
    with pytest.raises(FedsimError, match="ran on a Deployment Engine.*resume=true"):
        run_experiment(resumed, out, progress=False, resume=True)
    assert json.loads((out / "summary.json").read_text())["rounds_completed"] == 3  # nothing was touched
