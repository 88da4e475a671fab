//! The stages on PostgreSQL (`--backend postgres`, feature `postgres`):
//! what the engine does on a server, each beside raw PostgreSQL doing the
//! same work through the same client (`INSERT` into a plain table with a
//! bigint key, no ids to check, no seq to serialise) — and, in the README,
//! beside the SQLite stage of the same name.
//!
//! The server is the one `--postgres` (or `REFLEXR_PG_URL`) names; each
//! measurement gets a schema of its own, dropped after.

use std::sync::Arc;
use std::time::Instant;

use reflexr::postgres::{Client, NoTls};
use reflexr::{Engine, Postgres, Query};

use super::stages::event;
use super::{Ctx, Figure, rate, raw};

/// A schema of its own on the server, dropped with it.
struct Schema {
    url: String,
    name: String,
}

impl Schema {
    fn new(url: &str) -> Schema {
        let name = format!("bench_{}", uuid::Uuid::now_v7().simple());
        let mut c = Client::connect(url, NoTls).expect("the server answers");
        c.batch_execute(&format!("CREATE SCHEMA {name}")).unwrap();
        Schema {
            url: url.into(),
            name,
        }
    }

    fn config(&self) -> String {
        format!("{} options='-c search_path={}'", self.url, self.name)
    }

    fn engine(&self) -> Engine<Postgres> {
        let engine = Engine::builder_postgres(self.config())
            .pool_size(20)
            .open()
            .expect("open on PostgreSQL");
        engine.ensure_workspace("bench", &["tick"]).unwrap();
        engine
    }

    /// A client with the raw baseline's table.
    fn raw(&self) -> Client {
        let mut c = Client::connect(&self.config(), NoTls).unwrap();
        c.batch_execute(
            "CREATE TABLE IF NOT EXISTS raw_events \
             (seq bigserial PRIMARY KEY, id text NOT NULL, payload text NOT NULL)",
        )
        .unwrap();
        c
    }
}

impl Drop for Schema {
    fn drop(&mut self) {
        if let Ok(mut c) = Client::connect(&self.url, NoTls) {
            let _ = c.batch_execute(&format!("DROP SCHEMA {} CASCADE", self.name));
        }
    }
}

fn raw_insert(c: &mut impl reflexr::postgres::GenericClient, i: usize) {
    let id = format!("raw-{i}");
    c.execute(
        "INSERT INTO raw_events (id, payload) VALUES ($1, $2)",
        &[&id, &raw::payload(i)],
    )
    .unwrap();
}

/// Every stage, in the order the table prints them.
pub fn stages(url: &str, ctx: &Ctx) -> Vec<Figure> {
    let mut out = Vec::new();
    out.extend(append_single(url, ctx));
    out.extend(append_concurrent16(url, ctx));
    out.extend(append_batch1000(url, ctx));
    out.extend(read_pages(url, ctx));
    out
}

/// One event per transaction, one caller: two round trips and a commit.
fn append_single(url: &str, ctx: &Ctx) -> Vec<Figure> {
    let n = ctx.n(1_000, 5_000);
    let s = Schema::new(url);
    let mut c = s.raw();
    let start = Instant::now();
    for i in 0..n {
        raw_insert(&mut c, i);
    }
    let baseline = rate(n, start.elapsed());
    let engine = s.engine();
    let start = Instant::now();
    for i in 0..n {
        engine.append("bench", &event(i)).unwrap();
    }
    let value = rate(n, start.elapsed());
    vec![Figure::new("pg_append_single", value, "events/s", baseline)]
}

/// 16 threads, each appending one event per transaction (its own pooled
/// connection). Appends serialise on the head row from the append to the
/// commit; the raw baseline's inserts do not.
fn append_concurrent16(url: &str, ctx: &Ctx) -> Vec<Figure> {
    const CALLERS: usize = 16;
    let each = ctx.n(100, 500);
    let s = Arc::new(Schema::new(url));
    drop(s.raw());
    let start = Instant::now();
    let threads: Vec<_> = (0..CALLERS)
        .map(|t| {
            let s = Arc::clone(&s);
            std::thread::spawn(move || {
                let mut c = Client::connect(&s.config(), NoTls).unwrap();
                for k in 0..each {
                    raw_insert(&mut c, t * each + k);
                }
            })
        })
        .collect();
    for t in threads {
        t.join().unwrap();
    }
    let baseline = rate(CALLERS * each, start.elapsed());
    let engine = s.engine();
    let start = Instant::now();
    let threads: Vec<_> = (0..CALLERS)
        .map(|t| {
            let engine = engine.clone();
            std::thread::spawn(move || {
                for k in 0..each {
                    engine.append("bench", &event(t * each + k)).unwrap();
                }
            })
        })
        .collect();
    for t in threads {
        t.join().unwrap();
    }
    let value = rate(CALLERS * each, start.elapsed());
    vec![Figure::new(
        "pg_append_concurrent16",
        value,
        "events/s",
        baseline,
    )]
}

/// 1,000 events per transaction: one round trip per append.
fn append_batch1000(url: &str, ctx: &Ctx) -> Vec<Figure> {
    let n = ctx.n(10_000, 50_000);
    let s = Schema::new(url);
    let mut c = s.raw();
    let start = Instant::now();
    for chunk in 0..n / 1_000 {
        let mut tx = c.transaction().unwrap();
        for k in 0..1_000 {
            raw_insert(&mut tx, chunk * 1_000 + k);
        }
        tx.commit().unwrap();
    }
    let baseline = rate(n, start.elapsed());
    let engine = s.engine();
    let start = Instant::now();
    for chunk in 0..n / 1_000 {
        engine
            .write(|tx| {
                for k in 0..1_000 {
                    tx.append("bench", &event(chunk * 1_000 + k))?;
                }
                Ok(())
            })
            .unwrap();
    }
    let value = rate(n, start.elapsed());
    vec![Figure::new(
        "pg_append_batch1000",
        value,
        "events/s",
        baseline,
    )]
}

/// A consumer reading the log after its cursor, 1,000 events a page.
fn read_pages(url: &str, ctx: &Ctx) -> Vec<Figure> {
    let n = ctx.n(20_000, 100_000);
    let s = Schema::new(url);
    let engine = s.engine();
    for chunk in 0..n / 1_000 {
        engine
            .write(|tx| {
                for k in 0..1_000 {
                    tx.append("bench", &event(chunk * 1_000 + k))?;
                }
                Ok(())
            })
            .unwrap();
    }
    let mut c = Client::connect(&s.config(), NoTls).unwrap();
    // One pass first, not timed: the first read of new rows sets their
    // hint bits (it writes the pages), which neither timed pass should pay.
    let _ = c
        .query(
            "SELECT count(*) FROM reflexr_events WHERE workspace = 'bench'",
            &[],
        )
        .unwrap();
    let start = Instant::now();
    let mut after = 0i64;
    let mut read = 0;
    loop {
        let rows = c
            .query(
                "SELECT seq, id, type, subject, payload FROM reflexr_events \
                 WHERE workspace = 'bench' AND seq > $1 ORDER BY seq LIMIT 1000",
                &[&after],
            )
            .unwrap();
        let Some(last) = rows.last() else { break };
        after = last.get(0);
        read += rows.len();
    }
    let baseline = rate(read, start.elapsed());
    let start = Instant::now();
    let mut after = 0;
    let mut read = 0;
    loop {
        let page = engine
            .read(&Query::new("bench").after(after).limit(1_000))
            .unwrap();
        let Some(last) = page.last() else { break };
        after = last.seq;
        read += page.len();
    }
    let value = rate(read, start.elapsed());
    vec![Figure::new("pg_read_pages", value, "events/s", baseline)]
}
