"""``Communicator.from_env()``: the master, torchrun's job as one replica, the secret and TLS
from the environment a launcher sets (``_peer/core/environment.py``), and a clear
``InvalidUsageError`` for each variable that is missing or malformed."""

from __future__ import annotations

import pytest

import pccl_aio as pccl
from pccl_aio import blocking
from pccl_aio._peer.core.environment import DEFAULT_PORT, from_environ
from tests.helpers import SECRET

TORCHRUN = {"RANK": "1", "WORLD_SIZE": "2", "LOCAL_RANK": "1", "MASTER_ADDR": "10.1.2.3",
            "MASTER_PORT": "29500", "TORCHELASTIC_RUN_ID": "job-7"}


def test_the_master_is_named_or_beside_torchruns_rank_0():
    assert from_environ({"PCCL_AIO_MASTER": "m1:5000"}) == (["m1:5000"], {})
    assert from_environ({"PCCL_AIO_MASTER": "m1:5000, [::1]:5001"})[0] == \
        ["m1:5000", "[::1]:5001"]
    assert from_environ({"MASTER_ADDR": "10.0.0.9"})[0] == [f"10.0.0.9:{DEFAULT_PORT}"]
    assert from_environ({"MASTER_ADDR": "::1", "PCCL_AIO_MASTER_PORT": "6000"})[0] == \
        ["[::1]:6000"]
    # (PCCL_AIO_MASTER wins over torchrun's store address)
    assert from_environ({"PCCL_AIO_MASTER": "m:1", "MASTER_ADDR": "x"})[0] == ["m:1"]


def test_a_torchrun_job_of_several_processes_is_one_replica():
    _, options = from_environ({**TORCHRUN, "PCCL_AIO_MASTER": "m:1"})
    assert options == {"replica": "torchrun:job-7", "replica_size": 2, "peer_group": 1}
    _, options = from_environ({**TORCHRUN, "TORCHELASTIC_RUN_ID": "none"})
    assert options["replica"] == "torchrun:10.1.2.3:29500"  # (torchrun's default run id)
    _, options = from_environ({**TORCHRUN, "PCCL_AIO_REPLICA": "r9"})
    assert options["replica"] == "r9"
    _, options = from_environ({**TORCHRUN, "WORLD_SIZE": "1", "RANK": "0"})
    assert options == {}  # (a job of one process is a plain peer)
    _, options = from_environ({"MASTER_ADDR": "h", "PCCL_AIO_PEER_GROUP": "3"})
    assert options == {"peer_group": 3}


@pytest.mark.parametrize(("env", "match"), [
    ({}, r"no master named: set \$PCCL_AIO_MASTER"),
    ({"PCCL_AIO_MASTER": "nohost"}, r"\$PCCL_AIO_MASTER's address must be 'host:port'"),
    ({"PCCL_AIO_MASTER": "h:1,h:99999"}, "port must be in 1..65535"),
    ({"MASTER_ADDR": "h", "PCCL_AIO_MASTER_PORT": "x1"}, r"\$PCCL_AIO_MASTER_PORT must be"),
    ({**TORCHRUN, "RANK": "2"}, r"\$RANK must be an integer in 0..1"),
    ({**TORCHRUN, "WORLD_SIZE": "-2"}, r"\$WORLD_SIZE must be an integer"),
    ({"MASTER_ADDR": "h", "PCCL_AIO_PEER_GROUP": "g"}, r"\$PCCL_AIO_PEER_GROUP must be"),
])
def test_a_missing_or_malformed_variable_is_named(env, match):
    with pytest.raises(pccl.InvalidUsageError, match=match):
        from_environ(env)


def test_from_env_builds_the_communicator_the_environment_names(monkeypatch, tmp_path):
    for name, value in {**TORCHRUN, "PCCL_AIO_MASTER": "127.0.0.1:1"}.items():
        monkeypatch.setenv(name, value)
    secret = tmp_path / "run.secret"
    secret.write_text(SECRET + "\n")
    monkeypatch.setenv("PCCL_AIO_SECRET_FILE", str(secret))
    with blocking.Communicator.from_env(data_timeout=3.0) as comm:
        cfg = comm.config
        assert (cfg.replica, cfg.replica_size, cfg.peer_group) == ("torchrun:job-7", 2, 1)
        assert cfg.masters == (("127.0.0.1", 1),) and cfg.key and cfg.data_timeout == 3.0
        with pytest.raises(pccl.MasterConnectionError):  # (no master there)
            comm.connect(attempts=1, timeout=5)
    monkeypatch.setenv("PCCL_AIO_SECRET_FILE", str(tmp_path / "missing"))
    with pytest.raises(pccl.InvalidUsageError, match="cannot read the secret file"):
        pccl.Communicator.from_env()
    secret.write_text("password\n")
    monkeypatch.setenv("PCCL_AIO_SECRET_FILE", str(secret))
    with pytest.raises(pccl.InvalidUsageError, match="too weak"):
        pccl.Communicator.from_env()
