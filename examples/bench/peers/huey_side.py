"""huey, a task queue for Python, on SQLite with every commit synced
(`fsync=True`: `synchronous=FULL`, WAL), for the column the performance guide
compares ("Beside pgqueuer and huey"): single enqueues, one task a
transaction, into a new file in a temporary directory. Not part of
`cargo test` or CI.

    python3 -m venv /tmp/peers && /tmp/peers/bin/pip install huey==3.5.4
    /tmp/peers/bin/python examples/bench/peers/huey_side.py 5000

Run it in turn with the bench's `--only enqueue_single`.
"""
import sys, tempfile, time
from huey import SqliteHuey

def enqueue_single(n):
    with tempfile.TemporaryDirectory() as d:
        huey = SqliteHuey(filename=f"{d}/huey.db", fsync=True)

        @huey.task()
        def noop(n):
            return None

        noop(-1)  # the file and its tables made before the clock starts
        start = time.perf_counter()
        for i in range(n):
            noop(i)
        rate = n / (time.perf_counter() - start)
        assert len(huey) == n + 1
        return rate

print(f"huey_enqueue_single {enqueue_single(int(sys.argv[1])):.1f} enqueues/s")
