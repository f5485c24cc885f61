"""Real servers on free ports for the scale-out tests and benchmark: a 3-master Redis Cluster and
a Sentinel set (one master, one replica, three sentinels), of ``tests.helpers.redis_server_binary``
(the embedded index's ``valkey-server``, or Debian's ``redis-server``), and an
S3-compatible server (moto's standalone server). Used by the tests' fixtures
(``tests.topology_fixtures``, ``tests.s3_fixtures``) and by ``bench.scale_bench``.
"""

from __future__ import annotations

import functools
import random
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import httpx
import redis
from redis.cluster import ClusterNode, RedisCluster

from store.index.embedded.files import die_with_parent
from tests.helpers import free_port, redis_server_binary

SERVICE = "kvpmaster"
SLOTS = 16384


def cluster_port() -> int:
    """A free port whose cluster bus port (+10000) is free too (both below 65536)."""
    while True:
        port = random.randint(20000, 50000)
        try:
            with socket.socket() as a, socket.socket() as b:
                a.bind(("127.0.0.1", port))
                b.bind(("127.0.0.1", port + 10000))
        except OSError:
            continue
        return port


def _start(args: list[str], cwd: Path) -> subprocess.Popen[bytes]:
    return subprocess.Popen(
        [redis_server_binary(), *args],
        cwd=cwd,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        preexec_fn=die_with_parent,
    )


def _node_args(port: int) -> list[str]:
    return ["--port", str(port), "--bind", "127.0.0.1", "--save", "", "--appendonly", "no"]


def _wait(check, what: str, timeout_s: float = 120.0) -> None:
    """Poll ``check`` until it is true; ``timeout_s`` only bounds a hang (a busy machine starts slowly)."""
    deadline = time.monotonic() + timeout_s
    while True:
        try:
            if check():
                return
        except (redis.RedisError, OSError, httpx.HTTPError):
            pass
        if time.monotonic() > deadline:
            raise RuntimeError(f"{what} did not come up within {timeout_s:.0f} s")
        time.sleep(0.1)


def _knows_all(state: Any) -> bool:
    """Whether a sentinel knows the other two sentinels and the replica (it finds replicas through
    the master's INFO, every 10 s: a failover before that has no replica to promote)."""
    return bool(state["num-other-sentinels"] == 2 and state["num-slaves"] == 1)


class _Servers:
    """Processes by port: one can be SIGKILLed (a master dying), all stopped at the end."""

    processes: dict[int, subprocess.Popen[bytes]]

    def kill(self, port: int) -> None:
        """SIGKILL the server on ``port`` (a cluster master's slots then stay uncovered: the local
        cluster has no replicas)."""
        self.processes[port].kill()
        self.processes[port].wait(60)

    def stop(self) -> None:
        for process in self.processes.values():
            process.kill()
            process.wait(60)


class LocalCluster(_Servers):
    """Three cluster-enabled masters on free ports, each serving a third of the slots."""

    def __init__(self) -> None:
        self.dir = Path(tempfile.mkdtemp(prefix="kvp-cluster-"))
        self.ports = [cluster_port() for _ in range(3)]
        self.processes: dict[int, subprocess.Popen[bytes]] = {}

    @property
    def url(self) -> str:
        return "redis+cluster://" + ",".join(f"127.0.0.1:{p}" for p in self.ports)

    def start(self) -> LocalCluster:
        for port in self.ports:
            self.processes[port] = _start(
                [
                    *_node_args(port),
                    "--cluster-enabled",
                    "yes",
                    "--cluster-config-file",
                    f"nodes-{port}.conf",
                    "--cluster-node-timeout",
                    "2000",
                    "--cluster-require-full-coverage",
                    "no",
                ],
                self.dir,
            )
        for port in self.ports:
            _wait(lambda port=port: redis.Redis(port=port).ping(), f"cluster node {port}")
        self._join()
        for port in self.ports:
            _wait(
                lambda port=port: (
                    redis.Redis(port=port).execute_command("CLUSTER INFO").get("cluster_state") == "ok"
                ),
                "the cluster",
            )
        return self

    def _join(self) -> None:
        """What ``redis-cli --cluster create`` does for masters alone: a third of the 16,384 slots
        and a config epoch of its own for each, then each meets the first."""
        first = redis.Redis(port=self.ports[0])
        for i, port in enumerate(self.ports):
            node = redis.Redis(port=port)
            node.execute_command("CLUSTER", "ADDSLOTSRANGE", i * SLOTS // 3, (i + 1) * SLOTS // 3 - 1)
            node.execute_command("CLUSTER", "SET-CONFIG-EPOCH", i + 1)
            if i:
                first.execute_command("CLUSTER", "MEET", "127.0.0.1", port)

    @functools.cached_property
    def client(self) -> RedisCluster:
        return RedisCluster(startup_nodes=[ClusterNode("127.0.0.1", p) for p in self.ports])

    def node_of(self, key: str) -> int:
        """The port of the master serving ``key``'s slot."""
        return int(self.client.get_node_from_key(key).port)


class LocalSentinel(_Servers):
    """A master, a replica and three sentinels watching them (service ``SERVICE``), failing over
    a second after the master stops answering."""

    def __init__(self) -> None:
        self.dir = Path(tempfile.mkdtemp(prefix="kvp-sentinel-"))
        self.master_port, self.replica_port = free_port(), free_port()
        self.sentinel_ports = [free_port() for _ in range(3)]
        self.processes: dict[int, subprocess.Popen[bytes]] = {}

    @property
    def url(self) -> str:
        return "redis+sentinel://" + ",".join(f"127.0.0.1:{p}" for p in self.sentinel_ports) + f"/{SERVICE}/0"

    def start(self) -> LocalSentinel:
        self.processes[self.master_port] = _start(_node_args(self.master_port), self.dir)
        self.processes[self.replica_port] = _start(
            [*_node_args(self.replica_port), "--replicaof", "127.0.0.1", str(self.master_port)], self.dir
        )
        for port in self.sentinel_ports:
            conf = self.dir / f"sentinel-{port}.conf"
            conf.write_text(
                f"port {port}\nbind 127.0.0.1\n"
                f"sentinel monitor {SERVICE} 127.0.0.1 {self.master_port} 2\n"
                f"sentinel down-after-milliseconds {SERVICE} 1000\n"
                f"sentinel failover-timeout {SERVICE} 5000\n"
                f"sentinel parallel-syncs {SERVICE} 1\n"
            )
            self.processes[port] = _start([str(conf), "--sentinel"], self.dir)
        _wait(
            lambda: redis.Redis(port=self.replica_port).info("replication")["master_link_status"] == "up",
            "the replica",
        )
        for port in self.sentinel_ports:
            _wait(
                lambda port=port: _knows_all(redis.Redis(port=port).sentinel_master(SERVICE)),
                f"sentinel {port}",
            )
        return self

    def master(self) -> int:
        """The port the sentinels name as master now."""
        _, port = redis.Redis(port=self.sentinel_ports[0]).sentinel_get_master_addr_by_name(SERVICE)  # type: ignore[misc]
        return int(port)


class LocalS3:
    """moto's standalone S3 server (real HTTP, the real boto3 client path) on a free port."""

    def __init__(self) -> None:
        self.port = free_port()
        self.process: subprocess.Popen[bytes] | None = None

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def start(self) -> LocalS3:
        command = [sys.executable, "-m", "moto.server", "-H", "127.0.0.1", "-p", str(self.port)]
        self.process = subprocess.Popen(command, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        _wait(
            lambda: httpx.get(f"{self.url}/moto-api/", timeout=1),
            "moto's S3 server (pip install 'moto[server]')",
        )
        return self

    def stop(self) -> None:
        if self.process is not None:
            self.process.terminate()
            self.process.wait(60)
