//! What operators look for, on PostgreSQL, as `store::events::scan`,
//! `store::runs::find` and `store::dead_letters::find` have it on SQLite:
//! bounded windows, so a filter that matches little never reads the whole
//! table.
//!
//! What differs: a run's input is matched at a path of `jsonb` elements
//! (translated from the filter's JSON path) against the filter's value as
//! JSON (`input::jsonb #> $n = $m::jsonb`), and
//! a run's emitted events are found by their id's prefix through an index
//! with `text_pattern_ops` (the database's collation may not sort ids byte
//! by byte).

use postgres::types::Type;

use super::events::{EVENT_COLUMNS, events_from};
use super::{PgConn, col, limit_of, runs::run_from};
use crate::base::dead_letter::DeadLetter;
use crate::base::error::Result;
use crate::base::event::Event;
use crate::store::dead_letters::Find;
use crate::store::runs::{BlockedRow, COLUMNS, FeedPos, RunRow};
use crate::store::{Inspect, RunFind};

/// `text` with `%`, `_` and `\` escaped for `LIKE … ESCAPE '\'`.
fn like_prefix(text: &str) -> String {
    let mut out = String::with_capacity(text.len() + 1);
    for c in text.chars() {
        if matches!(c, '%' | '_' | '\\') {
            out.push('\\');
        }
        out.push(c);
    }
    out.push('%');
    out
}

/// The next page's start: the last row's key when the page is full, else
/// the window's floor (None at the start).
fn next_below(last: Option<i64>, full: bool, floor: i64) -> Option<i64> {
    match last {
        Some(last) if full => Some(last),
        _ => (floor > 0).then_some(floor),
    }
}

impl Inspect for PgConn {
    fn scan_events(
        &self,
        workspace: &str,
        after: i64,
        types: &[String],
        subject: Option<&str>,
        limit: usize,
        window: usize,
    ) -> Result<(Vec<Event>, Option<i64>)> {
        let bound: Option<i64> = match i64::try_from(window) {
            Ok(w) if w < i64::MAX => {
                let offset = w.saturating_sub(1);
                self.query(
                    "SELECT seq FROM reflexr_events WHERE workspace = $1 AND seq > $2 \
                     ORDER BY seq LIMIT 1 OFFSET $3",
                    &[
                        (&workspace, Type::TEXT),
                        (&after, Type::INT8),
                        (&offset, Type::INT8),
                    ],
                )?
                .first()
                .map(|r| col(r, 0))
                .transpose()?
            }
            _ => None,
        };
        let upper = bound.unwrap_or(i64::MAX);
        let n = limit_of(limit);
        let rows = self.query(
            &format!(
                "SELECT {EVENT_COLUMNS} FROM reflexr_events \
                 WHERE workspace = $1 AND seq > $2 AND seq <= $3 \
                   AND (cardinality($4::text[]) = 0 OR type = ANY ($4)) \
                   AND ($5::text IS NULL OR subject = $5) \
                 ORDER BY seq LIMIT $6"
            ),
            &[
                (&workspace, Type::TEXT),
                (&after, Type::INT8),
                (&upper, Type::INT8),
                (&types, Type::TEXT_ARRAY),
                (&subject, Type::TEXT),
                (&n, Type::INT8),
            ],
        )?;
        let events = events_from(&rows)?;
        let reached = match events.last() {
            Some(last) if events.len() == limit => Some(last.seq),
            _ => bound,
        };
        Ok((events, reached))
    }

    fn events_with_id_prefix(&self, prefix: &str, limit: usize) -> Result<Vec<Event>> {
        let pattern = like_prefix(prefix);
        let n = limit_of(limit);
        let rows = self.query(
            &format!(
                "SELECT {EVENT_COLUMNS} FROM reflexr_events \
                 WHERE id LIKE $1 ESCAPE '\\' ORDER BY seq LIMIT $2"
            ),
            &[(&pattern, Type::TEXT), (&n, Type::INT8)],
        )?;
        events_from(&rows)
    }

    fn runs_end(&self) -> Result<i64> {
        let rows = self.query("SELECT coalesce(max(ord), 0) + 1 FROM reflexr_runs", &[])?;
        rows.first().map_or(Ok(1), |r| col(r, 0))
    }

    fn find_runs(&self, f: &RunFind<'_>) -> Result<(Vec<RunRow>, Option<i64>)> {
        let floor = f.before.saturating_sub(f.window).max(0);
        let (path, value) = match f.input {
            Some((path, value)) => (
                Some(super::control::path_elements(path)?),
                Some(value.to_string()),
            ),
            None => (None, None),
        };
        let n = limit_of(f.limit);
        let rows = self.query(
            &format!(
                "SELECT {COLUMNS} FROM reflexr_runs \
                 WHERE ord < $1 AND ord >= $2 \
                   AND ($3::text IS NULL OR state = $3) AND ($4::text IS NULL OR action = $4) \
                   AND ($5::text IS NULL OR rule = $5) AND ($6::text IS NULL OR workspace = $6) \
                   AND ($7::text IS NULL OR scope = $7) \
                   AND ($8::text[] IS NULL OR input::jsonb #> $8 = $9::jsonb) \
                 ORDER BY ord DESC LIMIT $10"
            ),
            &[
                (&f.before, Type::INT8),
                (&floor, Type::INT8),
                (&f.state, Type::TEXT),
                (&f.action, Type::TEXT),
                (&f.rule, Type::TEXT),
                (&f.workspace, Type::TEXT),
                (&f.scope, Type::TEXT),
                (&path, Type::TEXT_ARRAY),
                (&value, Type::TEXT),
                (&n, Type::INT8),
            ],
        )?;
        let runs: Vec<RunRow> = rows.iter().map(run_from).collect::<Result<_>>()?;
        let next = next_below(runs.last().map(|r| r.ord), runs.len() == f.limit, floor);
        Ok((runs, next))
    }

    /// Not indexed here (the feed by transaction took its index): it
    /// reads the whole table.
    fn runs_changed_after(&self, after: (i64, i64), limit: usize) -> Result<Vec<RunRow>> {
        let n = limit_of(limit);
        self.query(
            &format!(
                "SELECT {COLUMNS} FROM reflexr_runs WHERE (updated_at, ord) > ($1, $2) \
                 ORDER BY updated_at, ord LIMIT $3"
            ),
            &[
                (&after.0, Type::INT8),
                (&after.1, Type::INT8),
                (&n, Type::INT8),
            ],
        )?
        .iter()
        .map(run_from)
        .collect()
    }

    /// By transaction: the runs whose `changed_tx` (the transaction that
    /// changed them last, which every statement that changes a run stamps)
    /// is below the oldest
    /// transaction still running, after `pos`, in `(changed_tx, position)`
    /// order. Every transaction below that bound has ended, so nothing can
    /// still commit there: a change becomes visible to the feed once every
    /// transaction that began before it has ended, and none is passed over
    /// however late it commits. A run changed again later moves up to its
    /// new transaction and comes again.
    fn runs_feed(&self, pos: &mut FeedPos, limit: usize) -> Result<Vec<RunRow>> {
        let n = limit_of(limit);
        let (tx, ord) = match pos {
            FeedPos::Xact { tx, ord } => (*tx, *ord),
            // From a millisecond: from the oldest transaction that changed
            // a run at or after it (what it changed before is not repeated
            // unless that transaction changed it too), or from the oldest
            // running one.
            FeedPos::Since(ms) | FeedPos::Clock { at_ms: ms, .. } => {
                let from = *ms;
                let start = match self.query_opt(
                    "SELECT coalesce((SELECT min(changed_tx) FROM reflexr_runs \
                       WHERE updated_at >= $1), \
                       pg_snapshot_xmin(pg_current_snapshot())::text::bigint)",
                    &[(&from, Type::INT8)],
                )? {
                    Some(row) => col(&row, 0)?,
                    None => 0,
                };
                (start, i64::MIN)
            }
        };
        // One statement, so the bound and the rows come from one snapshot.
        let rows = self.query(
            &format!(
                "WITH w AS MATERIALIZED \
                   (SELECT pg_snapshot_xmin(pg_current_snapshot())::text::bigint AS bound) \
                 SELECT r.*, w.bound FROM w LEFT JOIN LATERAL \
                   (SELECT {COLUMNS}, changed_tx FROM reflexr_runs \
                    WHERE changed_tx < w.bound AND (changed_tx, ord) > ($1, $2) \
                    ORDER BY changed_tx, ord LIMIT $3) r ON true"
            ),
            &[(&tx, Type::INT8), (&ord, Type::INT8), (&n, Type::INT8)],
        )?;
        let at_tx = COLUMNS.split(',').count();
        let mut out = Vec::with_capacity(rows.len());
        let (mut next, mut bound) = ((tx, ord), tx);
        for row in &rows {
            bound = col(row, at_tx + 1)?;
            if let Some(changed) = col::<Option<i64>>(row, at_tx)? {
                let run = run_from(row)?;
                next = (changed, run.ord);
                out.push(run);
            }
        }
        // A short page read everything below the bound: go on from it.
        if out.len() < limit && bound > next.0 {
            next = (bound, i64::MIN);
        }
        *pos = FeedPos::Xact {
            tx: next.0,
            ord: next.1,
        };
        Ok(out)
    }

    fn blocked_lanes(&self, limit: usize) -> Result<Vec<BlockedRow>> {
        let n = limit_of(limit);
        self.query(
            "SELECT l.lane, l.head, r.rule, r.scope, r.last_error, l.updated_at \
             FROM reflexr_lanes l LEFT JOIN reflexr_runs r ON r.id = l.head \
             WHERE l.blocked ORDER BY l.updated_at DESC LIMIT $1",
            &[(&n, Type::INT8)],
        )?
        .iter()
        .map(|r| {
            Ok((
                col(r, 0)?,
                col(r, 1)?,
                col(r, 2)?,
                col(r, 3)?,
                col(r, 4)?,
                col(r, 5)?,
            ))
        })
        .collect()
    }

    fn dead_letters_end(&self) -> Result<i64> {
        let rows = self.query(
            "SELECT coalesce(max(id), 0) + 1 FROM reflexr_dead_letters",
            &[],
        )?;
        rows.first().map_or(Ok(1), |r| col(r, 0))
    }

    fn find_dead_letters(&self, f: &Find<'_>) -> Result<(Vec<DeadLetter>, Option<i64>)> {
        let floor = f.before.saturating_sub(f.window).max(0);
        let kind = f.kind.map(|k| k.as_str());
        let n = limit_of(f.limit);
        let rows = self.query(
            &format!(
                "SELECT {} FROM reflexr_dead_letters \
                 WHERE id < $1 AND id >= $2 AND ($3 OR resolved_at IS NULL) \
                   AND ($4::text IS NULL OR kind = $4) AND ($5::text IS NULL OR consumer = $5) \
                   AND ($6::text IS NULL OR workspace = $6) \
                   AND ($7::text IS NULL OR reason = $7) \
                 ORDER BY id DESC LIMIT $8",
                super::dead_letters::DEAD_LETTER_COLUMNS
            ),
            &[
                (&f.before, Type::INT8),
                (&floor, Type::INT8),
                (&f.include_resolved, Type::BOOL),
                (&kind, Type::TEXT),
                (&f.consumer, Type::TEXT),
                (&f.workspace, Type::TEXT),
                (&f.reason, Type::TEXT),
                (&n, Type::INT8),
            ],
        )?;
        let letters: Vec<DeadLetter> = rows
            .iter()
            .map(super::dead_letters::dead_letter_from)
            .collect::<Result<_>>()?;
        let next = next_below(
            letters.last().map(|d| d.id),
            letters.len() == f.limit,
            floor,
        );
        Ok((letters, next))
    }
}
