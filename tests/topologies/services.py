"""The real pieces of the production topologies: PgBouncer, Redis Sentinel, PostgreSQL clusters, a blackhole.

Every process is started here, on loopback and the ports given, with its files in a temporary
directory, and stopped by its own pid.
"""

from __future__ import annotations

import contextlib
import os
import pwd
import shutil
import signal
import socket
import subprocess
import tempfile
import threading
import time
from pathlib import Path

import redis

from tests.chaos.services import children
from tests.explorer.proxy import DropProxy, _Pair
from tests.helpers import wait_for

PG_BIN = Path("/usr/lib/postgresql/15/bin")


def as_postgres(command: list[str], timeout: float = 120, check: bool = True) -> str:
    """Run ``command`` as the postgres OS user (initdb and the server refuse root)."""
    if pwd.getpwuid(os.getuid()).pw_name != "postgres":
        command = ["su", "postgres", "-s", "/bin/sh", "-c", " ".join(_quote(part) for part in command)]
    done = subprocess.run(command, capture_output=True, text=True, timeout=timeout)
    if check and done.returncode:
        raise AssertionError(f"{command} failed ({done.returncode}):\n{done.stdout}\n{done.stderr}")
    return done.stdout


def _quote(part: str) -> str:
    return "'" + part.replace("'", "'\\''") + "'"


def owned_tempdir(prefix: str) -> Path:
    """A fresh directory the postgres OS user can write."""
    path = Path(tempfile.mkdtemp(prefix=prefix))
    if os.getuid() == 0:
        shutil.chown(path, "postgres")
    return path


def psql(port: int, sql: str, database: str = "postgres", timeout: float = 30, header: bool = False) -> str:
    """One statement through psql's simple-query protocol (PgBouncer's console speaks no other)."""
    command = ["psql", "-X", "-q", "-A", "-P", "footer=off", "-h", "127.0.0.1", "-p", str(port)]
    command += ["-U", "postgres", "-d", database] + ([] if header else ["-t"])
    done = subprocess.run([*command, "-c", sql], capture_output=True, text=True, timeout=timeout)
    if done.returncode:
        raise AssertionError(f"psql -p {port} {sql!r}: {done.stderr.strip()}")
    return done.stdout


def terminate_backends(port: int, pids: list[int]) -> int:
    """pg_terminate_backend on each of ``pids`` (directly, not through PgBouncer); how many ended."""
    listed = ",".join(str(pid) for pid in pids)
    query = f"SELECT count(*) FILTER (WHERE pg_terminate_backend(pid)) FROM unnest(ARRAY[{listed}]) AS pid"
    return int(psql(port, query).strip() or 0)


def stop_pid(pid: int, sig: int = signal.SIGTERM, timeout: float = 30) -> None:
    """Signal ``pid`` and wait for it to be gone; SIGKILL it if it lingers."""
    with contextlib.suppress(ProcessLookupError):
        os.kill(pid, sig)
    deadline = time.monotonic() + timeout
    while _alive(pid):
        if time.monotonic() > deadline:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
            deadline = time.monotonic() + timeout
        time.sleep(0.05)


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    # A zombie child of ours counts as gone once reaped.
    with contextlib.suppress(ChildProcessError):
        if os.waitpid(pid, os.WNOHANG)[0] == pid:
            return False
    status = Path(f"/proc/{pid}/stat")
    return status.exists() and status.read_text().split()[2] != "Z"


class PgBouncer:
    """Debian's pgbouncer in transaction pooling, in front of one database of the machine's PostgreSQL."""

    def __init__(self, port: int, database: str, server_port: int = 5432) -> None:
        self.port = port
        self.dir = owned_tempdir("topo-pgbouncer-")
        self.alias = "topo"
        (self.dir / "users.txt").write_text('"postgres" ""\n')
        (self.dir / "pgbouncer.ini").write_text(
            f"""[databases]
{self.alias} = host=127.0.0.1 port={server_port} dbname={database} user=postgres

[pgbouncer]
listen_addr = 127.0.0.1
listen_port = {port}
unix_socket_dir =
auth_type = trust
auth_file = {self.dir}/users.txt
admin_users = postgres
pool_mode = transaction
default_pool_size = 8
max_client_conn = 200
server_lifetime = 3600
logfile = {self.dir}/pgbouncer.log
"""
        )
        self.process: subprocess.Popen[bytes] | None = None

    def start(self) -> PgBouncer:
        command = ["pgbouncer", str(self.dir / "pgbouncer.ini")]
        if os.getuid() == 0:
            command[1:1] = ["-u", "postgres"]  # it refuses to run as root
        self.process = subprocess.Popen(
            command, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True
        )
        wait_for(self._answers, timeout=30, what=f"pgbouncer on port {self.port}")
        return self

    def _answers(self) -> bool:
        assert self.process is not None
        assert self.process.poll() is None, f"pgbouncer exited:\n{self.log()[-2000:]}"
        try:
            return psql(self.port, "SELECT 1", self.alias, timeout=5).strip() == "1"
        except (AssertionError, subprocess.TimeoutExpired):
            return False

    def admin(self, command: str) -> str:
        return psql(self.port, command, "pgbouncer")

    def server_pids(self) -> list[int]:
        """The PostgreSQL backends of PgBouncer's server connections (SHOW SERVERS' remote_pid)."""
        lines = psql(self.port, "SHOW SERVERS", "pgbouncer", header=True).splitlines()
        column = lines[0].split("|").index("remote_pid")
        return [int(row.split("|")[column]) for row in lines[1:] if row.split("|")[column].isdigit()]

    def log(self) -> str:
        path = self.dir / "pgbouncer.log"
        return path.read_text(errors="replace") if path.exists() else ""

    def stop(self) -> None:
        if self.process is not None and self.process.poll() is None:
            self.process.send_signal(signal.SIGINT)  # SIGINT: safe shutdown, waits for no client
            try:
                self.process.wait(timeout=10)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait(timeout=10)
        shutil.rmtree(self.dir, ignore_errors=True)


class RedisNode:
    """One redis-server (master or replica) or redis-sentinel of the Sentinel group."""

    def __init__(self, port: int, directory: Path, command: list[str]) -> None:
        self.port = port
        self.dir = directory
        self.command = command
        self.process: subprocess.Popen[bytes] | None = None

    def client(self, timeout: float = 2) -> redis.Redis:
        return redis.Redis(port=self.port, socket_timeout=timeout, socket_connect_timeout=timeout)

    def start(self) -> RedisNode:
        with (self.dir / f"{self.port}.log").open("ab") as log:
            self.process = subprocess.Popen(self.command, stdout=log, stderr=log, start_new_session=True)
        wait_for(self._answers, timeout=30, what=f"redis on port {self.port}")
        return self

    def _answers(self) -> bool:
        assert self.process is not None
        if self.process.poll() is not None:
            raise AssertionError(f"redis on port {self.port} exited; is the port free?")
        try:
            return bool(self.client(1).ping())
        except redis.RedisError:
            return False

    def kill(self) -> None:
        """SIGKILL: the process is gone with whatever it held."""
        if self.process is not None and self.process.poll() is None:
            self.process.kill()
            self.process.wait(timeout=30)

    def stop(self) -> None:
        if self.process is not None and self.process.poll() is None:
            self.process.terminate()
            try:
                self.process.wait(timeout=10)
            except subprocess.TimeoutExpired:
                self.kill()


class SentinelGroup:
    """A master, a replica and three sentinels (quorum 2) watching them, on consecutive ports."""

    name = "topologies"

    def __init__(self, data_port: int, sentinel_port: int) -> None:
        self.dir = Path(tempfile.mkdtemp(prefix="topo-sentinel-"))
        self.data = [self._server(data_port), self._server(data_port + 1, replica_of=data_port)]
        self.sentinels = [self._sentinel(sentinel_port + n, data_port) for n in range(3)]

    def _server(self, port: int, replica_of: int | None = None) -> RedisNode:
        command = ["redis-server", "--port", str(port), "--bind", "127.0.0.1", "--save", ""]
        command += ["--appendonly", "no", "--dir", str(self.dir), "--dbfilename", f"{port}.rdb"]
        if replica_of is not None:
            command += ["--replicaof", "127.0.0.1", str(replica_of)]
        return RedisNode(port, self.dir, command)

    def _sentinel(self, port: int, master: int) -> RedisNode:
        config = self.dir / f"sentinel-{port}.conf"  # sentinels rewrite their file: one each
        config.write_text(
            f"""port {port}
bind 127.0.0.1
dir {self.dir}
sentinel monitor {self.name} 127.0.0.1 {master} 2
sentinel down-after-milliseconds {self.name} 1000
sentinel failover-timeout {self.name} 4000
sentinel parallel-syncs {self.name} 1
"""
        )
        return RedisNode(port, self.dir, ["redis-sentinel", str(config)])

    @property
    def ports(self) -> list[int]:
        return [node.port for node in self.sentinels]

    def start(self) -> SentinelGroup:
        for node in self.data + self.sentinels:
            node.start()
        wait_for(lambda: self._replicas_seen(), timeout=60, what="the sentinels to see the replica")
        return self

    def _replicas_seen(self) -> bool:
        try:
            return all(
                len(node.client().execute_command("SENTINEL", "REPLICAS", self.name)) >= 1  # type: ignore[no-untyped-call]
                and self.master_port() == self.data[0].port
                for node in self.sentinels
            )
        except redis.RedisError:
            return False

    def master_port(self) -> int:
        """The master the sentinels name now."""
        reply = self.sentinels[0].client().execute_command("SENTINEL", "GET-MASTER-ADDR-BY-NAME", self.name)  # type: ignore[no-untyped-call]
        return int(reply[1])

    def node(self, port: int) -> RedisNode:
        return next(node for node in self.data if node.port == port)

    def wait_master_moved(self, old: int) -> int:
        """Wait until every sentinel names a new master that says it is one; return its port."""

        def moved() -> int:
            try:
                ports = {
                    int(
                        node.client().execute_command("SENTINEL", "GET-MASTER-ADDR-BY-NAME", self.name)[1]  # type: ignore[no-untyped-call]
                    )
                    for node in self.sentinels
                }
                if len(ports) != 1 or old in ports:
                    return 0
                port = ports.pop()
                role = self.node(port).client().execute_command("ROLE")  # type: ignore[no-untyped-call]
                return port if role[0] in (b"master", "master") else 0
            except redis.RedisError:
                return 0

        return int(wait_for(moved, timeout=60, what=f"the sentinels to elect a master other than {old}"))

    def failover(self) -> int:
        """SENTINEL FAILOVER: a graceful switch of roles; returns the new master's port."""
        old = self.master_port()
        self.sentinels[0].client().execute_command("SENTINEL", "FAILOVER", self.name)  # type: ignore[no-untyped-call]
        return self.wait_master_moved(old)

    def kill_master(self) -> int:
        """SIGKILL the master, wait for the sentinels to elect the replica, restart the dead one."""
        old = self.master_port()
        node = self.node(old)
        node.kill()
        new = self.wait_master_moved(old)
        node.start()  # back empty; the sentinels make it a replica of the new master
        return new

    def drop_locks(self, pattern: str = "django_idempotent_tasks:lock:*") -> int:
        """Delete every lock on the master: the database lease must arbitrate alone."""
        client = self.node(self.master_port()).client()
        names = list(client.scan_iter(pattern))
        return int(client.delete(*names)) if names else 0

    def stop(self) -> None:
        for node in self.sentinels + self.data:
            node.stop()
        shutil.rmtree(self.dir, ignore_errors=True)


class Cluster:
    """A PostgreSQL 15 cluster of our own (initdb or pg_basebackup), run as the postgres OS user."""

    def __init__(self, root: Path, name: str, port: int) -> None:
        self.data = root / name
        self.root = root
        self.port = port

    def initdb(self, **settings: str) -> Cluster:
        as_postgres(
            [str(PG_BIN / "initdb"), "-D", str(self.data), "-A", "trust", "-U", "postgres", "--no-sync"]
        )
        self.configure(**settings)
        return self

    def basebackup(self, source: Cluster, conninfo: str, **settings: str) -> Cluster:
        """A standby of ``source``: pg_basebackup -R, streaming from ``conninfo``."""
        command = [str(PG_BIN / "pg_basebackup"), "-h", "127.0.0.1", "-p", str(source.port), "-U", "postgres"]
        as_postgres([*command, "-D", str(self.data), "-R", "-X", "stream", "-c", "fast", "--no-sync"])
        self.configure(primary_conninfo=f"'{conninfo}'", **settings)
        return self

    def configure(self, **settings: str) -> None:
        lines = [f"{name} = {value}" for name, value in settings.items()]
        with (self.data / "postgresql.auto.conf").open("a") as conf:
            conf.write("\n".join(lines) + "\n")

    def start(self) -> Cluster:
        options = f"-p {self.port} -k {self.root} -c listen_addresses=127.0.0.1 -c fsync=off"
        log = str(self.data / "server.log")
        as_postgres(
            [
                str(PG_BIN / "pg_ctl"),
                "-D",
                str(self.data),
                "-w",
                "-t",
                "60",
                "-l",
                log,
                "-o",
                options,
                "start",
            ]
        )
        return self

    @property
    def pid(self) -> int | None:
        """The postmaster's pid, from its pid file (None when the cluster is not running)."""
        path = self.data / "postmaster.pid"
        try:
            return int(path.read_text().split()[0])
        except (OSError, ValueError, IndexError):
            return None

    def sql(self, statement: str, database: str = "postgres") -> str:
        return psql(self.port, statement, database)

    def crash(self) -> None:
        """The machine is gone: SIGKILL the postmaster and every one of its processes at once."""
        pid = self.pid
        if pid is None:
            return
        for process in [pid, *children(pid)]:
            with contextlib.suppress(ProcessLookupError):
                os.kill(process, signal.SIGKILL)
        stop_pid(pid, signal.SIGKILL)

    def promote(self) -> None:
        as_postgres([str(PG_BIN / "pg_ctl"), "-D", str(self.data), "-w", "-t", "60", "promote"])

    def stop(self) -> None:
        """Immediate shutdown (SIGQUIT to the postmaster), by the pid in its pid file."""
        pid = self.pid
        if pid is not None:
            stop_pid(pid, signal.SIGQUIT)

    def log(self) -> str:
        path = self.data / "server.log"
        return path.read_text(errors="replace") if path.exists() else ""


class BlackholeProxy(DropProxy):
    """A TCP proxy that can stop forwarding in both directions without closing anything.

    While it is blackholed, bytes stay in the kernel's buffers, as packets do on a partitioned link:
    the peers wait and see no error; after ``heal`` they flow again, unless ``stop`` drops them.
    """

    def __init__(self, port: int, target: tuple[str, int]) -> None:
        super().__init__(port, target)
        self.open = threading.Event()
        self.open.set()
        self.started_at: float | None = None
        self.healed_at: float | None = None

    def start(self) -> BlackholeProxy:
        super().start()
        return self

    def blackhole(self) -> None:
        self.started_at = time.monotonic()
        self.open.clear()

    def heal(self) -> None:
        self.healed_at = time.monotonic()
        self.open.set()

    def stop(self) -> None:
        # close() alone leaves the port listening while the accept thread is blocked in accept().
        with contextlib.suppress(OSError):
            self.listener.shutdown(socket.SHUT_RDWR)
        super().stop()
        self.open.set()  # the pumps wake up on closed sockets and end; nothing held is forwarded

    def _accept(self) -> None:
        while True:
            try:
                client, address = self.listener.accept()
            except OSError:
                return
            try:
                server = socket.create_connection(self.target)
            except OSError:
                client.close()  # the target is down (a crashed primary): so is this connection
                continue
            pair = _Pair(client, server)
            with self.lock:
                self.pairs[address[1]] = pair
            for source, sink, reply in ((client, server, False), (server, client, True)):
                threading.Thread(target=self._pump, args=(pair, source, sink, reply), daemon=True).start()

    def _pump(self, pair: _Pair, source: socket.socket, sink: socket.socket, reply: bool) -> None:
        try:
            while True:
                self.open.wait()
                data = source.recv(65536)
                if not data:
                    break
                self.open.wait()  # what arrived as the link went down waits for it to come back
                sink.sendall(data)
        except OSError:
            pass
        pair.close()


def free(port: int) -> bool:
    """Nothing listens on ``port`` of the loopback."""
    with socket.socket() as probe:
        return probe.connect_ex(("127.0.0.1", port)) != 0


def require_free(*ports: int) -> None:
    busy = [port for port in ports if not free(port)]
    assert not busy, (
        f"ports {busy} are taken: a previous run left a process behind, or set TOPOLOGIES_PORT_BASE"
    )
