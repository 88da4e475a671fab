"""pgqueuer, a PostgreSQL job queue for Python, on the server the bench's
PostgreSQL stages use, for the columns the performance guide compares
("Beside pgqueuer"): single enqueues, one job a transaction; the time from an
enqueue's return (and from its call) to its handler's start (LISTEN/NOTIFY),
one enqueue after another (`latency`) or each on an idle queue, 3 ms after the
last handler started (`latency-idle`, beside the bench's `pg_latency_enqueue`,
which waits for the run to end, then 3 ms: this script cannot see when
pgqueuer marked the job done); four
worker processes draining 10,000 no-op jobs. Not part of `cargo test` or CI.

    python3 -m venv /tmp/peers && /tmp/peers/bin/pip install pgqueuer==1.6.0 asyncpg
    export REFLEXR_PG_URL='host=127.0.0.1 port=5432 user=reflexr dbname=reflexr_test'
    /tmp/peers/bin/python examples/bench/peers/pgqueuer_side.py enqueue 5000
    /tmp/peers/bin/python examples/bench/peers/pgqueuer_side.py latency 300
    /tmp/peers/bin/python examples/bench/peers/pgqueuer_side.py latency-idle 300
    /tmp/peers/bin/python examples/bench/peers/pgqueuer_side.py drain 10000 4

Run each in turn with the bench's `--backend postgres --only pg_enqueue_single`,
`pg_latency_inprocess`, `pg_latency_enqueue` (which also runs
`pg_latency_enqueue_back_to_back`, beside `latency`) and
`pg_runs_4processes`. `REFLEXR_PG_URL` is the
libpq key=value string `tests/pg/cluster.sh` prints; each measure makes its
own schema (`pgq_*`) and drops it first.
"""
import asyncio, os, statistics, sys, time
import asyncpg
from pgqueuer.db import AsyncpgDriver
from pgqueuer.queries import Queries
from pgqueuer.qm import QueueManager
from pgqueuer.types import QueueExecutionMode

def conninfo():
    kv = dict(p.split("=", 1) for p in os.environ["REFLEXR_PG_URL"].split())
    return dict(host=kv["host"], port=int(kv["port"]), user=kv["user"], database=kv["dbname"])

async def fresh(schema):
    c = await asyncpg.connect(**conninfo())
    await c.execute(f"DROP SCHEMA IF EXISTS {schema} CASCADE; CREATE SCHEMA {schema}")
    await c.close()
    c = await asyncpg.connect(**conninfo(), server_settings={"search_path": schema})
    q = Queries(AsyncpgDriver(c))
    await q.install()
    return c, q

async def enqueue_single(n):
    c, q = await fresh("pgq_enqueue")
    start = time.perf_counter()
    for i in range(n):
        await q.enqueue("noop", b'{"n": %d}' % i)
    rate = n / (time.perf_counter() - start)
    await c.close()
    return rate

async def latency(n, idle):
    c, q = await fresh("pgq_latency")
    wc = await asyncpg.connect(**conninfo(), server_settings={"search_path": "pgq_latency"})
    qm = QueueManager(Queries(AsyncpgDriver(wc)))
    got = asyncio.Queue()

    @qm.entrypoint("noop")
    async def noop(job):
        got.put_nowait(time.perf_counter())

    runner = asyncio.create_task(qm.run())
    await asyncio.sleep(1.0)
    waits, calls = [], []
    for i in range(n):
        called = time.perf_counter()
        await q.enqueue("noop", b"{}")
        t = time.perf_counter()
        try:
            done = await asyncio.wait_for(got.get(), 10)
        except asyncio.TimeoutError:
            failed = runner.exception() if runner.done() else None
            raise SystemExit(f"no handler within 10 s (the worker: {failed})")
        waits.append((done - t) * 1000)
        calls.append((done - called) * 1000)
        if idle:
            # Beside the bench's `pg_latency_enqueue`: each enqueue on a
            # queue left idle for 3 ms.
            await asyncio.sleep(0.003)
    qm.shutdown.set()
    await runner
    await c.close()
    waits.sort(); calls.sort()
    return (statistics.median(waits), waits[int(len(waits) * 0.99) - 1],
            statistics.median(calls), calls[int(len(calls) * 0.99) - 1])

async def fill(n):
    c, q = await fresh("pgq_drain")
    for k in range(0, n, 1000):
        m = min(1000, n - k)
        await q.enqueue(["noop"] * m, [b"{}"] * m, [0] * m)
    await c.close()

async def worker():
    wc = await asyncpg.connect(**conninfo(), server_settings={"search_path": "pgq_drain"})
    qm = QueueManager(Queries(AsyncpgDriver(wc)))
    done = 0

    @qm.entrypoint("noop")
    async def noop(job):
        nonlocal done
        done += 1

    print("ready", flush=True)
    await asyncio.get_running_loop().run_in_executor(None, sys.stdin.readline)
    await qm.run(mode=QueueExecutionMode.drain)
    print(f"handled {done}", flush=True)

async def drain(n, procs):
    import subprocess
    await fill(n)
    ws = [subprocess.Popen([sys.executable, __file__, "worker"], stdin=subprocess.PIPE,
                           stdout=subprocess.PIPE, text=True) for _ in range(procs)]
    for w in ws:
        assert w.stdout.readline().strip() == "ready"
    start = time.perf_counter()
    for w in ws:
        w.stdin.write("go\n"); w.stdin.flush()
    handled = 0
    for w in ws:
        handled += int(w.stdout.readline().split()[1]); w.wait()
    took = time.perf_counter() - start
    return handled, handled / took

async def main():
    what = sys.argv[1]
    if what == "worker":
        await worker(); return
    if what == "drain":
        handled, rate = await drain(int(sys.argv[2]), int(sys.argv[3]))
        print(f"pgqueuer_drain {sys.argv[3]} processes: {handled} jobs, {rate:.1f} jobs/s"); return
    if what == "enqueue":
        print(f"pgqueuer_enqueue_single {await enqueue_single(int(sys.argv[2])):.1f} enqueues/s")
    else:
        idle = what == "latency-idle"
        p50, p99, c50, c99 = await latency(int(sys.argv[2]), idle)
        print(f"pgqueuer_latency{'_idle' if idle else ''}: from the enqueue's return "
              f"p50 {p50:.2f} ms p99 {p99:.2f} ms; from its call p50 {c50:.2f} ms p99 {c99:.2f} ms")

asyncio.run(main())
