"""The holes of issue 25, each closed: a regression test per hole, on the database DATABASE_URL names."""

from __future__ import annotations

import os
import signal
import threading
from collections.abc import Iterator
from typing import Any

import pytest
from django.db import DatabaseError, OperationalError, connection, transaction
from django.db.transaction import TransactionManagementError

from django_idempotent_tasks import keys, signals, store, values
from django_idempotent_tasks.exceptions import AttemptsExhausted, LeaseLost, UnstorableResult
from django_idempotent_tasks.lease import Lease
from django_idempotent_tasks.models import IdempotencyRecord
from tests.helpers import (
    SETTLE_TIMEOUT,
    START_TIMEOUT,
    Worker,
    calls,
    finished,
    lapsed,
    leases_lost,
    wait_for,
)
from tests.testapp import tasks
from tests.testapp.faults import arm, control
from tests.testapp.models import Effect
from tests.topologies.services import BlackholeProxy


def mariadb() -> bool:
    return connection.vendor == "mysql" and bool(getattr(connection, "mysql_is_mariadb", False))


#: Deeper than Python's JSON encoder goes (hole 3) and than MariaDB's JSON column allows (hole 7).
TOO_DEEP_FOR_PYTHON = 100_000  # past the JSON encoder's C recursion limit of Python 3.12+ too
TOO_DEEP_FOR_MARIADB = 40
#: Seconds SQLite waits for its write lock before "database is locked", in the SQLite test.
BUSY_TIMEOUT = 0.3
#: Seconds between the two steps of the paused holder (its lease is 2 s).
PAUSED_STEP_SLEEP = 3
#: Seconds another transaction holds a record's row lock: past the 1 s lease of renewal_blocked.
ROW_LOCK_HELD = 3
#: Seconds a blackholed proxy stays silent before it heals by itself: an unbounded call would then
#: succeed (and its test fail) instead of hanging the suite.
SILENCE_HEALS_AFTER = 60


def run_(task: Any, key: str) -> Any:
    return task.apply((), {"idempotency_key": key}, throw=True).get()


def run(task: Any, argument: Any, key: str) -> Any:
    return task.apply((argument,), {"idempotency_key": key}, throw=True).get()


def error_of(record: IdempotencyRecord) -> dict[str, str]:
    assert record.error is not None
    return dict(record.error)


@pytest.mark.django_db(transaction=True)
class TestValues:
    def test_3_a_result_too_deep_to_encode_is_unstorable_and_replays(self) -> None:
        with pytest.raises(UnstorableResult, match="nested too deeply"):
            run(tasks.deep_result, TOO_DEEP_FOR_PYTHON, "deep-result")
        assert run(tasks.deep_result, TOO_DEEP_FOR_PYTHON, "deep-result") is None
        record = IdempotencyRecord.objects.get(key="deep-result")
        assert (record.status, record.result, error_of(record)["type"]) == (
            "SUCCEEDED",
            None,
            "UnstorableResult",
        )
        assert calls("deep-result") == 1

    def test_3_a_step_value_too_deep_to_encode_fails_the_key_for_good(self) -> None:
        with pytest.raises(ValueError, match="Step 'deep' cannot be checkpointed"):
            run(tasks.deep_step, TOO_DEEP_FOR_PYTHON, "deep-step")
        with pytest.raises(AttemptsExhausted):
            run(tasks.deep_step, TOO_DEEP_FOR_PYTHON, "deep-step")
        assert IdempotencyRecord.objects.get(key="deep-step").status == "FAILED"
        assert calls("deep-step") == 1

    def test_7_a_result_deeper_than_the_json_column_allows_never_reruns(self) -> None:
        for _ in range(2):
            try:
                run(tasks.deep_result, TOO_DEEP_FOR_MARIADB, "column-result")
            except UnstorableResult:
                assert mariadb()
        record = IdempotencyRecord.objects.get(key="column-result")
        assert record.status == "SUCCEEDED"
        assert calls("column-result") == 1
        if mariadb():
            assert (record.result, error_of(record)["type"]) == (None, "UnstorableResult")

    def test_7_a_step_value_deeper_than_the_json_column_allows_never_reruns(self) -> None:
        for _ in range(2):
            try:
                run(tasks.deep_step, TOO_DEEP_FOR_MARIADB, "column-step")
            except (ValueError, AttemptsExhausted):
                assert mariadb()
        record = IdempotencyRecord.objects.get(key="column-step")
        assert record.status == ("FAILED" if mariadb() else "SUCCEEDED")
        assert calls("column-step") == 1
        if mariadb():
            assert "nested" in error_of(record)["message"]


def test_8_a_tuple_default_that_arrives_as_a_list_is_the_default() -> None:
    def run_(order_id: int, sizes: tuple[Any, ...] = (1, (2, 3)), flags: tuple[Any, ...] = ()) -> None:
        """A body with tuple defaults."""

    assert keys.passed_arguments(run_, (7,), {"sizes": [1, [2, 3]], "flags": []}) == {"order_id": 7}
    assert keys.passed_arguments(run_, (7,), {"sizes": [1, [2, 4]]}) == {"order_id": 7, "sizes": [1, [2, 4]]}
    assert keys.passed_arguments(run_, (7,), {"flags": {}}) == {"order_id": 7, "flags": {}}


@pytest.mark.django_db(transaction=True)
def test_8_a_tuple_default_passed_explicitly_replays() -> None:
    first = tasks.tuple_default.apply((1,), {"idempotency_key": "tuple"}, throw=True).get()
    # What the broker delivers for (1, (2, 3)) passed explicitly: JSON has no tuple.
    again = tasks.tuple_default.apply((1, [1, [2, 3]]), {"idempotency_key": "tuple"}, throw=True).get()
    assert again == first
    assert Effect.objects.filter(key="tuple").count() == 1


@pytest.mark.django_db(transaction=True)
class TestBrokenTransactions:
    def test_4_an_atomic_body_that_broke_its_transaction_ends_failed(self) -> None:
        unstorable: list[str] = []

        def receiver(sender: Any, reason: str, **kwargs: Any) -> None:
            unstorable.append(reason)

        signals.result_unstorable.connect(receiver)
        try:
            with pytest.raises(TransactionManagementError, match="broken by a database error"):
                run_(tasks.breaks_its_transaction, "broken")
        finally:
            signals.result_unstorable.disconnect(receiver)
        record = IdempotencyRecord.objects.get(key="broken")
        assert (record.status, error_of(record)["type"]) == ("FAILED", "TransactionManagementError")
        assert unstorable == []
        assert not Effect.objects.filter(key="broken").exists()  # rolled back with the transaction

    def test_5_a_body_that_left_autocommit_off_never_completes_into_it(self) -> None:
        try:
            with pytest.raises(TransactionManagementError, match="autocommit"):
                run_(tasks.leaves_autocommit_off, "autocommit")
        finally:
            # What Celery's Django fix-up does after a task: close the connection (a rollback).
            if not transaction.get_autocommit():
                transaction.rollback()
                transaction.set_autocommit(True)
        record = IdempotencyRecord.objects.get(key="autocommit")
        assert (record.status, error_of(record)["type"]) == ("FAILED", "TransactionManagementError")
        assert "autocommit" in error_of(record)["message"]
        assert not Effect.objects.filter(key="autocommit").exists()


@pytest.mark.django_db(transaction=True)
@pytest.mark.skipif(connection.vendor != "sqlite", reason="SQLite's one write lock")
def test_6_sqlite_busy_at_the_completion_waits_and_completes() -> None:
    with connection.cursor() as cursor:
        cursor.execute(f"PRAGMA busy_timeout = {int(BUSY_TIMEOUT * 1000)}")
    try:
        result = run(tasks.meets_a_busy_sqlite, BUSY_TIMEOUT * 5, "busy")
    finally:
        connection.close()  # its next user gets the settings' timeout back
    record = IdempotencyRecord.objects.get(key="busy")
    assert (record.status, record.fence, record.result) == ("SUCCEEDED", 1, result)
    assert Effect.objects.filter(key="busy").count() == 1


def test_7_json_depth_skips_brackets_inside_strings() -> None:
    assert values.json_depth('{"a": ["[[{\\"", {"b": []}]}') == 4
    assert values.json_depth('"[[["') == 0


@pytest.mark.django_db(transaction=True)
def test_a_holders_writes_name_its_claim_token_not_a_fence_a_failover_can_repeat() -> None:
    claim = store.insert(
        "s",
        "token",
        task_name="t",
        fingerprint="f",
        task_id="a",
        worker="w:1",
        lease_seconds=60,
        record_ttl=60,
    )
    assert claim is not None and claim.token
    # A failover lost that claim, and a new claim on the promoted server got the same fence (and the
    # same primary key): only the token tells them apart.
    IdempotencyRecord.objects.filter(key="token").update(claim_token=store.new_token(), task_id="b")
    assert not store.renew(claim, 60)
    assert not store.checkpoint(claim, {"a": 1})
    assert not store.complete(claim, {"done": True}, None, 60)
    assert not store.fail(claim, values.error_shape("RuntimeError", "late"))
    record = IdempotencyRecord.objects.get(key="token")
    assert (record.status, record.fence, record.steps, record.task_id) == ("IN_PROGRESS", 1, {}, "b")


@pytest.mark.django_db(transaction=True)
def test_every_claim_draws_a_new_token() -> None:
    run(tasks.deep_result, 1, "tokens")
    first = IdempotencyRecord.objects.get(key="tokens")
    IdempotencyRecord.objects.filter(key="tokens").update(status="FAILED")
    run(tasks.deep_result, 1, "tokens")
    second = IdempotencyRecord.objects.get(key="tokens")
    assert len(first.claim_token) == len(second.claim_token) == 32
    assert (second.fence, second.status) == (2, "SUCCEEDED")
    assert second.claim_token != first.claim_token


@pytest.mark.workers
def test_1_a_holder_resumed_after_a_takeover_runs_no_further_step(running_workers: list[Worker]) -> None:
    tasks.pauses_between_steps.delay(PAUSED_STEP_SLEEP, idempotency_key="w15")
    pid = int(wait_for(lambda: control().get("between:w15"), timeout=START_TIMEOUT, what="the first step"))
    os.kill(pid, signal.SIGSTOP)
    try:
        lapsed(tasks.pauses_between_steps.name, "w15")
        tasks.pauses_between_steps.delay(PAUSED_STEP_SLEEP, idempotency_key="w15")
        done = finished("w15")
    finally:
        os.kill(pid, signal.SIGCONT)
    wait_for(lambda: 1 in leases_lost("w15"), timeout=SETTLE_TIMEOUT, what="the resumed holder to stop")
    assert done.fence == 2
    assert control().lrange("second:w15", 0, -1) == [b"2"]  # the second step ran once, under fence 2


@pytest.mark.workers
def test_2_a_raise_task_whose_holder_died_is_run_again_not_answered_in_progress(
    running_workers: list[Worker],
) -> None:
    arm("after_effect", "w16")
    tasks.raising_short_lease.delay(1, idempotency_key="w16")
    done = finished("w16")
    assert (done.fence, done.attempts) == (2, 2)
    effects = list(Effect.objects.filter(key="w16").order_by("pk").values_list("fence", "recovered"))
    assert effects == [(1, False), (2, True)]


@pytest.mark.django_db(transaction=True)
@pytest.mark.skipif(connection.vendor == "sqlite", reason="SQLite has no row locks (hole 6 waits it out)")
class TestBoundedWaits:
    def test_a_holder_that_could_not_renew_before_its_lease_ended_knows_it(self) -> None:
        with pytest.raises(LeaseLost, match="lost its lease"):
            run(tasks.renewal_blocked, ROW_LOCK_HELD, "unrenewed")
        assert calls("unrenewed") == 0

    def test_a_bounded_write_blocked_by_a_row_lock_gives_up(self) -> None:
        claim = store.insert(
            "s",
            "bounded",
            task_name="t",
            fingerprint="f",
            task_id="a",
            worker="w:1",
            lease_seconds=60,
            record_ttl=60,
        )
        assert claim is not None
        locked, release = threading.Event(), threading.Event()

        def holder() -> None:
            with transaction.atomic():
                list(IdempotencyRecord.objects.select_for_update().filter(key="bounded"))
                locked.set()
                release.wait(ROW_LOCK_HELD * 10)
            connection.close()

        thread = threading.Thread(target=holder)
        thread.start()
        locked.wait()
        try:
            with pytest.raises(DatabaseError), store.bounded(0.5):
                store.renew(claim, 60)
        finally:
            release.set()
            thread.join()
        connection.close()  # the cancelled statement's connection: the next test gets a fresh one
        assert store.renew(claim, 60)


@pytest.fixture
def silent_peer(transactional_db: Any) -> Iterator[BlackholeProxy]:
    """The records' connection goes through a TCP proxy that can go silent while staying connected
    (RELIABILITY.md T6 in miniature: the kernel keeps the link alive, no keepalive ever fires)."""
    settings = connection.settings_dict
    proxy = BlackholeProxy(0, (str(settings["HOST"]), int(settings["PORT"]))).start()
    saved = dict(settings)
    connection.close()
    # As docs/deployment.md asks: connecting is bounded too (the proxy accepts, then stays silent).
    options = {**settings.get("OPTIONS", {}), "connect_timeout": 2}
    settings.update(HOST="127.0.0.1", PORT=str(proxy.port), OPTIONS=options)
    healer = threading.Timer(SILENCE_HEALS_AFTER, proxy.heal)
    healer.start()
    try:
        yield proxy
    finally:
        healer.cancel()
        proxy.heal()
        connection.close()
        settings.clear()
        settings.update(saved)
        proxy.stop()


def claim_of(key: str) -> store.Claim:
    claim = store.insert(
        "s", key, task_name="t", fingerprint="f", task_id="a", worker="w:1", lease_seconds=60, record_ttl=60
    )
    assert claim is not None
    return claim


@pytest.mark.skipif(connection.vendor != "postgresql", reason="the proxy carries PostgreSQL's TCP port")
class TestSilentPeer:
    """Issue #25: the claim and the completion's first write end even when the database's peer stops
    answering and the link stays up; only a client-side deadline can end those waits."""

    def test_a_claim_through_a_silent_peer_gives_up(self, silent_peer: BlackholeProxy) -> None:
        connection.ensure_connection()
        silent_peer.blackhole()
        with pytest.raises(OperationalError), store.bounded(0.5):
            store.insert(
                "s",
                "silent",
                task_name="t",
                fingerprint="f",
                task_id="a",
                worker="w",
                lease_seconds=60,
                record_ttl=60,
            )
        silent_peer.heal()
        # The cut INSERT may still land once the link heals (docs/guarantee.md): as this delivery's.
        assert set(IdempotencyRecord.objects.filter(key="silent").values_list("task_id", flat=True)) <= {"a"}

    def test_a_take_over_through_a_silent_peer_gives_up(self, silent_peer: BlackholeProxy) -> None:
        claim = claim_of("silent")
        assert store.fail(claim, values.error_shape("E", "failed"))
        record = store.lookup("s", "silent")
        assert record is not None
        silent_peer.blackhole()
        with pytest.raises(OperationalError), store.bounded(0.5):
            store.take_over(record, task_id="b", worker="w", lease_seconds=60, record_ttl=60)
        silent_peer.heal()
        assert IdempotencyRecord.objects.get(key="silent").status == IdempotencyRecord.Status.FAILED

    def test_a_completion_through_a_silent_peer_fails_within_its_lease(
        self, silent_peer: BlackholeProxy
    ) -> None:
        claim = claim_of("silent")
        lease = Lease(claim, None, label="silent", ttl=1, atomic=False, send=lambda *a, **k: None)
        silent_peer.blackhole()
        with pytest.raises(OperationalError):
            lease.write(lambda: store.complete(claim, 1, None, 60))
        silent_peer.heal()
        # The cut UPDATE may still land once the link heals (docs/guarantee.md): only as this claim's.
        record = IdempotencyRecord.objects.get(key="silent")
        assert (record.status, record.claim_token) in {
            (IdempotencyRecord.Status.IN_PROGRESS, claim.token),
            (IdempotencyRecord.Status.SUCCEEDED, claim.token),
        }
