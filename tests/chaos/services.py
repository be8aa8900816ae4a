"""The processes a chaos run owns: its lock Redis, its two workers and (soak) its PostgreSQL."""

from __future__ import annotations

import contextlib
import os
import pwd
import shutil
import signal
import subprocess
import tempfile
import threading
import time
from pathlib import Path

import redis

from tests.helpers import Worker, wait_for

# Clock jump emulation: libfaketime crashes Debian's redis-server 7.0, so expire every lock at once.
_EXPIRE_LOCKS = """
local n = 0
for _, name in ipairs(redis.call("keys", ARGV[1])) do
    redis.call("pexpire", name, 1)
    n = n + 1
end
return n
"""
_DELETE_STORM = """
local n = 0
for _, name in ipairs(redis.call("keys", "storm:*")) do
    n = n + redis.call("unlink", name)
end
return n
"""


FAKETIME_LIBRARY = "/usr/lib/x86_64-linux-gnu/faketime/libfaketimeMT.so.1"
SKEWS = {"ahead": "+300s", "behind": "-300s"}


def kill_group(pid: int, sig: int = signal.SIGKILL) -> None:
    """Signal a process group that may already be gone."""
    with contextlib.suppress(ProcessLookupError):
        os.killpg(pid, sig)


def children(pid: int) -> list[int]:
    out = subprocess.run(["pgrep", "-P", str(pid)], capture_output=True, text=True).stdout
    return [int(child) for child in out.split()]


class LockRedis:
    """A redis-server of our own for the locks, so faults can restart, pause and evict it."""

    def __init__(self, port: int) -> None:
        self.port = port
        self.url = f"redis://127.0.0.1:{port}/0"
        self.dir = Path(tempfile.mkdtemp(prefix="idem-chaos-redis-"))
        self.process: subprocess.Popen[bytes] | None = None

    def client(self, timeout: float = 5) -> redis.Redis:
        return redis.Redis(port=self.port, socket_timeout=timeout, socket_connect_timeout=timeout)

    def start(self) -> LockRedis:
        command = ["redis-server", "--port", str(self.port), "--bind", "127.0.0.1", "--save", ""]
        command += ["--appendonly", "no", "--enable-debug-command", "yes", "--dir", str(self.dir)]
        with (self.dir / "redis.log").open("ab") as log:
            self.process = subprocess.Popen(command, stdout=log, stderr=log, start_new_session=True)
        wait_for(self._answers, timeout=30, what=f"the lock Redis on port {self.port}")
        return self

    def _answers(self) -> bool:
        assert self.process is not None
        if self.process.poll() is not None:
            raise AssertionError(f"redis-server on port {self.port} exited; is the port free?")
        try:
            return bool(self.client(1).ping())
        except redis.RedisError:
            return False

    def restart_without_persistence(self) -> None:
        """R1: SHUTDOWN NOSAVE, then a fresh empty server on the same port."""
        with contextlib.suppress(redis.RedisError):  # the server closes the connection as it goes
            self.client().shutdown(nosave=True)
        assert self.process is not None
        self.process.wait(timeout=30)
        self.start()

    def storm(self) -> int:
        """R5: maxmemory 2mb, allkeys-random and a flood of keys; returns how many were evicted."""
        client = self.client(30)
        before = int(client.info("stats")["evicted_keys"])
        client.config_set("maxmemory-policy", "allkeys-random")
        client.config_set("maxmemory", "2mb")
        client.execute_command("DEBUG", "POPULATE", 50_000, "storm", 64)  # type: ignore[no-untyped-call]
        for _ in range(20):
            client.set("storm:tick", "x" * 1024)  # every command evicts until memory fits
            time.sleep(0.1)
        return int(client.info("stats")["evicted_keys"]) - before

    def calm(self) -> None:
        """End the storm: no memory limit, no flood keys."""
        client = self.client(30)
        client.config_set("maxmemory", "0")
        client.eval(_DELETE_STORM, 0)

    def expire_locks(self) -> int:
        """R7: expire every lock key at once; returns how many there were."""
        return int(self.client().eval(_EXPIRE_LOCKS, 0, "django_idempotent_tasks:lock:*"))

    def stop(self) -> None:
        if self.process is not None and self.process.poll() is None:
            kill_group(self.process.pid)
            self.process.wait(timeout=30)
        shutil.rmtree(self.dir, ignore_errors=True)


class WorkerPool:
    """Two ``celery worker -P prefork -c 2`` slots; a fault may kill a slot's worker and restart it."""

    def __init__(self, env: dict[str, str], size: int = 2, skewed: bool = False) -> None:
        # pytest-django exports DJANGO_SETTINGS_MODULE=tests.settings: override it, or the workers
        # would run without the short visibility timeout and never restore a lost worker's messages.
        self.env = {**env, "DJANGO_SETTINGS_MODULE": "tests.chaosapp.settings"}
        self.slots = [self._new(n) for n in range(size)]
        self.locks = [threading.Lock() for _ in range(size)]
        self.every: list[Worker] = []
        # C1/C2: one worker 300 s ahead and one 300 s behind, each on its own queue.
        self.skewed = [self._skewed(name, offset) for name, offset in SKEWS.items()] if skewed else []

    def _skewed(self, name: str, offset: str) -> Worker:
        env = {
            **self.env,
            "DJANGO_SETTINGS_MODULE": "tests.chaosapp.settings_skewed",
            "LD_PRELOAD": FAKETIME_LIBRARY,  # never given to redis-server, which it crashes
            "FAKETIME": offset,
            "FAKETIME_DONT_RESET": "1",
        }
        return Worker(
            f"chaos-{name}",
            env,
            concurrency=1,
            app="tests.chaosapp.celery_app",
            extra=("-Q", f"chaos.{name}"),
        )

    def _new(self, n: int) -> Worker:
        worker = Worker(
            f"chaos{n}", self.env, app="tests.chaosapp.celery_app", extra=("-Q", "chaos,chaos.urgent")
        )
        return worker

    def start(self) -> None:
        for worker in self.slots + self.skewed:
            self.every.append(worker)
            worker.start()

    def restart(self, n: int) -> None:
        worker = self._new(n)
        self.every.append(worker)
        self.slots[n] = worker.start()

    def stop(self) -> None:
        """Warm shutdown of every worker ever started here, then SIGKILL whatever is left."""
        for worker in self.every:
            try:
                if worker.process is not None and worker.process.poll() is None:
                    worker.stop()
            finally:
                if worker.process is not None:
                    kill_group(worker.process.pid)

    def logs(self) -> list[str]:
        return [str(worker.log) for worker in self.every]


class PrivatePostgres:
    """The soak's own PostgreSQL cluster (started by scripts/soak.sh), restarted by a fault."""

    def __init__(self, data_dir: str, bin_dir: str) -> None:
        self.data_dir = data_dir
        self.bin_dir = bin_dir

    def restart(self) -> None:
        """A fast restart: every backend is terminated, every connection breaks."""
        command = (
            f"{self.bin_dir}/pg_ctl -D {self.data_dir} -m fast -w -t 60 -l {self.data_dir}/server.log restart"
        )
        if pwd.getpwuid(os.getuid()).pw_name == "postgres":
            subprocess.run(["bash", "-c", command], check=True, capture_output=True, timeout=120)
        else:
            subprocess.run(["su", "postgres", "-c", command], check=True, capture_output=True, timeout=120)
