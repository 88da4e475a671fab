//! Opening a PostgreSQL database: applying `schema.pg.sql` to a new one,
//! migrating an older one forward, refusing a newer one.

use std::path::PathBuf;

use postgres::Client;

use crate::error::{Error, Result};

/// The schema of a new database, `schema.pg.sql` at the repository root.
pub(crate) const SCHEMA_SQL: &str = include_str!("../../../schema.pg.sql");

/// The PostgreSQL schema version this library writes. Must match the
/// `INSERT INTO reflexr_schema_version` line of `schema.pg.sql`.
pub(crate) const SCHEMA_VERSION: i32 = 1;

/// Steps that take an older database forward: `(n, sql)` takes version
/// `n - 1` to `n`, and its SQL ends by recording `n` in
/// `reflexr_schema_version`. None yet: version 1 is the first.
const MIGRATIONS: &[(i32, &str)] = &[];

/// The advisory lock (a constant key: "rflx" in ASCII) that one opener
/// holds while it applies or migrates the schema; another opener waits for
/// it, then finds the schema applied.
const SCHEMA_LOCK: i64 = 0x7266_6c78;

/// Applies or migrates the schema on `client`'s database, in one
/// transaction; `what` names the database in errors.
pub(crate) fn apply(client: &mut Client, what: &str) -> Result<()> {
    let mut tx = client.transaction()?;
    tx.execute("SELECT pg_advisory_xact_lock($1)", &[&SCHEMA_LOCK])?;
    let exists: bool = tx
        .query_one(
            "SELECT to_regclass('reflexr_schema_version') IS NOT NULL",
            &[],
        )?
        .get(0);
    if !exists {
        tx.batch_execute(SCHEMA_SQL)?;
        return Ok(tx.commit()?);
    }
    let found: Option<i32> = tx
        .query_one("SELECT max(version) FROM reflexr_schema_version", &[])?
        .get(0);
    let found = found.unwrap_or(0);
    if found > SCHEMA_VERSION {
        return Err(Error::SchemaTooNew {
            path: PathBuf::from(what),
            found: found.into(),
            supported: SCHEMA_VERSION.into(),
        });
    }
    for (to, sql) in MIGRATIONS {
        if *to > found {
            tx.batch_execute(sql)?;
        }
    }
    Ok(tx.commit()?)
}
