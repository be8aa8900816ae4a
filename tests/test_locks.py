from __future__ import annotations

import gc
import weakref
from collections.abc import Callable

import redis

from django_idempotent_tasks.heartbeat import Heartbeat
from django_idempotent_tasks.locks import RedisLock, lock_holder
from tests.helpers import wait_for


def test_the_lock_is_owned_through_its_token(lock_redis: redis.Redis) -> None:
    first, second = RedisLock(lock_redis, "l", 5), RedisLock(lock_redis, "l", 5)
    assert first.acquire() and not second.acquire()
    assert lock_holder(lock_redis, "l") == first.token
    assert not second.extend() and not second.release()  # never a plain DEL of another's lock
    assert first.extend() and 4000 < int(lock_redis.pttl("l")) <= 5000
    assert first.release() and lock_holder(lock_redis, "l") is None


def counting(beats: list[int], answer: bool = True) -> Callable[[], bool]:
    """A beat that records each call and answers ``answer``."""

    def beat() -> bool:
        beats.append(1)
        return answer

    return beat


def test_a_heartbeat_stopped_before_its_first_beat_never_starts_a_thread() -> None:
    beats: list[int] = []
    heartbeat = Heartbeat(0.2, counting(beats))
    heartbeat.begin()
    heartbeat.stop()
    later: list[int] = []
    after = Heartbeat(0.3, counting(later, answer=False))
    after.begin()  # due after the first: once it beats, the scheduler has passed the first
    wait_for(lambda: later, timeout=10, what="the later heartbeat")
    assert beats == [] and heartbeat.thread is None


def test_a_heartbeat_stopped_before_its_first_beat_is_freed_at_once() -> None:
    # Not when the beat would have been due: a busy worker finishes thousands of short deliveries
    # within one interval (lock_ttl / 3), and kept every one's heartbeat until then.
    heartbeat = Heartbeat(60, counting([]))
    heartbeat.begin()
    heartbeat.stop()
    freed = weakref.ref(heartbeat)
    del heartbeat
    gc.collect()
    assert freed() is None


def test_a_running_heartbeat_beats_every_interval_until_stopped() -> None:
    beats: list[int] = []
    heartbeat = Heartbeat(0.05, counting(beats))
    heartbeat.begin()
    wait_for(lambda: len(beats) >= 3, timeout=10, what="three beats")
    heartbeat.stop()
    assert heartbeat.thread is not None
    heartbeat.thread.join(timeout=5)
    assert not heartbeat.thread.is_alive()


def test_a_beat_returning_false_ends_the_heartbeat() -> None:
    beats: list[int] = []
    heartbeat = Heartbeat(0.05, counting(beats, answer=False))
    heartbeat.begin()
    thread = wait_for(lambda: heartbeat.thread, timeout=10, what="the heartbeat to start")
    thread.join(timeout=5)
    assert beats == [1]
