//! PostgreSQL's reader.

use crate::shared::*;
use common::backend::TestBackend;
use reflexr::{Error, Query};
use reflexr_testkit as common;

/// PostgreSQL's reader: the application's queries and the engine's reads in a
/// read-only transaction; a write in it is refused by the server and changes
/// nothing (invariant 10).
#[test]
fn a_reader_on_postgres_reads_and_cannot_write() {
    let (_place, _clock, engine) = setup::<reflexr::Postgres>();
    engine
        .write(|tx| {
            <reflexr::Postgres as TestBackend>::insert_thing(tx, "t-1")?;
            tx.append("app", &made("t-1"))
        })
        .unwrap();
    let (rows, events) = engine
        .with_reader(|tx| {
            let rows: i64 = tx.query("SELECT count(*) FROM things", &[])?[0].get(0);
            Ok((rows, tx.read(&Query::new("app"))?.len()))
        })
        .unwrap();
    assert_eq!((rows, events), (1, 1));
    let e = engine
        .with_reader(|tx| tx.execute("INSERT INTO things (id) VALUES ('t-2')", &[]))
        .unwrap_err();
    assert!(matches!(e, Error::ReadOnly { .. }), "{e}");
    assert_eq!(<reflexr::Postgres as TestBackend>::things(&engine), ["t-1"]);
}
