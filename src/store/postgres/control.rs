//! Control of the work, counters and dead letters on PostgreSQL, as
//! `store::control`, `store::counters` and `store::dead_letters` have them
//! on SQLite.
//!
//! What differs: a counter is the sum of its rows — a bump inserts one,
//! and one bump in [`FOLD_EVERY`] folds them into one — so the settlements
//! of many processes never queue behind one row's lock until their commits
//! (an `UPDATE` of one row per counter made them wait for each other, and
//! deadlock when two took two counters in opposite orders); and a
//! partition is the input's value at a path of `jsonb` elements (`#>>`),
//! translated from the JSON path the configuration accepts (a jsonpath
//! cast on the server could fail, and with it every claim).

use std::collections::{HashMap, HashSet};

use postgres::Row;
use postgres::types::Type;

use super::{PgConn, col};
use crate::base::error::{Error, Result};
use crate::store::control::{ActionRow, FairState, FencedStand, KeyRow, PausedRow};
use crate::store::runs::{Inserted, NewRun, RunRow};
use crate::store::{ClaimPlan, Control};

/// The first key of the advisory locks a limited action's claims take
/// ("rfxl" in ASCII, as an int4).
const LIMIT_LOCK: i32 = 0x7266_786c;

const ACTION_COLUMNS: &str =
    "action, priority, max_running, rate_count, rate_period_ms, partition_by, fair";

const KEY_COLUMNS: &str =
    "action, key, max_running, rate_count, rate_period_ms, weight, updated_at";

fn key_from(r: &Row) -> Result<KeyRow> {
    Ok(KeyRow {
        action: col(r, 0)?,
        key: col(r, 1)?,
        max_running: limit(col(r, 2)?)?,
        rate_count: limit(col(r, 3)?)?,
        rate_period_ms: col(r, 4)?,
        weight: limit(col(r, 5)?)?,
        updated_at: col(r, 6)?,
    })
}

/// A limit as stored (bigint) as the settings have it.
fn limit(n: Option<i64>) -> Result<Option<u32>> {
    n.map(|n| u32::try_from(n).map_err(|_| Error::invalid("reflexr_actions", "a limit too large")))
        .transpose()
}

fn action_from(r: &Row) -> Result<ActionRow> {
    Ok(ActionRow {
        action: col(r, 0)?,
        priority: col(r, 1)?,
        max_running: limit(col(r, 2)?)?,
        rate_count: limit(col(r, 3)?)?,
        rate_period_ms: col(r, 4)?,
        partition_by: col(r, 5)?,
        fair: col(r, 6)?,
    })
}

/// Those of `actions` the claim counts or orders: a limit, fair, or a
/// key's override (the condition on `reflexr_actions a`).
const LIMITED: &str = "(max_running IS NOT NULL OR rate_count IS NOT NULL OR fair \
     OR (partition_by IS NOT NULL \
         AND EXISTS (SELECT 1 FROM reflexr_action_keys k WHERE k.action = a.action)))";

/// Whether the action `param` names may be handed over (see
/// [`Control::may_hand_over`]; on PostgreSQL the evaluator asks it in the
/// statements of [`Control::hand_over_fresh`] and
/// [`Control::insert_handed_at_once`]), as SQL: neither paused nor limited.
pub(super) fn may_hand_over(param: &str) -> String {
    format!(
        "NOT EXISTS (SELECT 1 FROM reflexr_paused WHERE kind = 'action' AND name = {param}) \
         AND NOT EXISTS (SELECT 1 FROM reflexr_actions a WHERE action = {param} AND {LIMITED})"
    )
}

/// A JSON path as the configuration accepts it (`$.a.b`, `$."a b"`,
/// `$.list[0]`, `$.list[#-1]`; see `limits::check_json_path`) as the path
/// elements of PostgreSQL's `#>`/`#>>`: keys as they are, `[N]` as `N`,
/// `[#-N]` as `-N` (from the end). No jsonpath is cast on the server, so
/// no path can make a statement fail there.
pub(super) fn path_elements(path: &str) -> Result<Vec<String>> {
    let bad = || Error::invalid("json path", format!("{path:?} is not a JSON path"));
    let mut rest = path.strip_prefix('$').ok_or_else(bad)?;
    let mut out = Vec::new();
    while !rest.is_empty() {
        if let Some(r) = rest.strip_prefix(".\"") {
            let end = r.find('"').ok_or_else(bad)?;
            out.push(r[..end].to_string());
            rest = &r[end + 1..];
        } else if let Some(r) = rest.strip_prefix('.') {
            let end = r.find(['.', '[']).unwrap_or(r.len());
            out.push(r[..end].to_string());
            rest = &r[end..];
        } else if let Some(r) = rest.strip_prefix('[') {
            let end = r.find(']').ok_or_else(bad)?;
            let index = &r[..end];
            out.push(match index.strip_prefix("#-") {
                Some(n) => format!("-{n}"),
                None => index.to_string(),
            });
            rest = &r[end + 1..];
        } else {
            return Err(bad());
        }
    }
    Ok(out)
}

/// Whether a run of these actions (`$2`) is ready and due at `$1`, or a
/// claim lapsed: an idle executor's look before it opens a transaction.
/// Each side names its partial index's state, so it reads that index (the
/// ready runs', the running runs'), not the table's finished runs.
pub(crate) const WORK_DUE: &str = "SELECT EXISTS (SELECT 1 FROM reflexr_runs WHERE state = 'ready' \
                      AND due_at <= $1 AND action = ANY ($2)) \
         OR EXISTS (SELECT 1 FROM reflexr_runs WHERE state = 'running' \
                      AND claim_expires_at <= $1)";

/// An idle executor's look ([`Control::work_due_at_once`]) in one
/// statement: whether a run of the actions `$2` (distinct names) not
/// paused is ready and due at `$1` (through the ready runs' partial index;
/// not looked for at all when every one of them is paused, a filter the
/// server checks once) or a claim lapsed (the running runs'), as
/// [`WORK_DUE`] asks of the actions left once the paused were taken out; whether any workflow waits for an event; and,
/// only then (an uncorrelated subquery in a branch not taken is not run),
/// whether events were appended past where the waits were last matched,
/// as `Steps::waits_behind` asks.
pub(crate) const IDLE_LOOK: &str = "SELECT EXISTS (SELECT 1 FROM reflexr_runs r WHERE r.state = 'ready' \
                      AND cardinality($2::text[]) > (SELECT count(*) FROM reflexr_paused \
                          WHERE kind = 'action' AND name = ANY ($2)) \
                      AND r.due_at <= $1 AND r.action = ANY ($2) \
                      AND NOT EXISTS (SELECT 1 FROM reflexr_paused p \
                                      WHERE p.kind = 'action' AND p.name = r.action)) \
         OR EXISTS (SELECT 1 FROM reflexr_runs WHERE state = 'running' \
                      AND claim_expires_at <= $1), \
       EXISTS (SELECT 1 FROM reflexr_event_waits), \
       CASE WHEN EXISTS (SELECT 1 FROM reflexr_event_waits) \
         THEN (SELECT EXISTS (SELECT 1 FROM reflexr_wait_positions p \
                 WHERE EXISTS (SELECT 1 FROM reflexr_event_waits w \
                               WHERE w.workspace = p.workspace) \
                   AND EXISTS (SELECT 1 FROM reflexr_events e \
                               WHERE e.workspace = p.workspace AND e.seq > p.position))) \
         ELSE false END";

impl Control for PgConn {
    /// One round trip instead of three: the lease's row is locked `FOR
    /// SHARE` as `Leases::is_held` locks it (a takeover waits for this
    /// write to end).
    fn fenced_stand(
        &self,
        lease: (&str, &str, i64),
        now: i64,
        workspace: &str,
        kind: &str,
        name: &str,
        pausable: bool,
    ) -> Result<Option<FencedStand>> {
        let (lease, holder, generation) = lease;
        let row = self
            .query_opt(
                "SELECT EXISTS (SELECT 1 FROM reflexr_leases \
                     WHERE name = $1 AND holder = $2 AND generation = $3 AND expires_at > $4 \
                     FOR SHARE), \
                   c.position, c.updated_at, \
                   $8 AND EXISTS (SELECT 1 FROM reflexr_paused WHERE kind = $6 AND name = $7) \
             FROM (SELECT 1) AS one \
             LEFT JOIN reflexr_cursors c ON c.workspace = $5 AND c.kind = $6 AND c.name = $7",
                &[
                    (&lease, Type::TEXT),
                    (&holder, Type::TEXT),
                    (&generation, Type::INT8),
                    (&now, Type::INT8),
                    (&workspace, Type::TEXT),
                    (&kind, Type::TEXT),
                    (&name, Type::TEXT),
                    (&pausable, Type::BOOL),
                ],
            )?
            .ok_or_else(|| Error::invalid("lease and cursor look", "no row"))?;
        let held: bool = col(&row, 0)?;
        if !held {
            return Ok(None);
        }
        let position: Option<i64> = col(&row, 1)?;
        let stamp: Option<i64> = col(&row, 2)?;
        Ok(Some(FencedStand {
            stand: position.zip(stamp),
            paused: col(&row, 3)?,
        }))
    }

    /// One round trip, where the pauses and each cursor were one each: the
    /// saved cursors among `names`, then the pauses among them, each
    /// matched by `= ANY`, which the server plans once per connection and
    /// keeps. (A join on `unnest` of the names, its first form, it planned
    /// again at every run: under the default `plan_cache_mode` a plan for
    /// the array at hand, estimated cheaper than the generic one, wins
    /// every time. Its statement log timed that at 0.127 ms of the
    /// server's time a run, against 0.026 ms for a plan kept.)
    fn stands(
        &self,
        workspace: &str,
        kind: &str,
        names: &[&str],
    ) -> Result<Vec<Option<(Option<(i64, i64)>, i64)>>> {
        let rows = self.query(
            "SELECT c.name, c.position, c.updated_at, coalesce(c.high_water, 0), false \
             FROM reflexr_cursors c \
             WHERE c.workspace = $1 AND c.kind = $2 AND c.name = ANY ($3) \
             UNION ALL \
             SELECT p.name, NULL, NULL, NULL, true FROM reflexr_paused p \
             WHERE p.kind = $2 AND p.name = ANY ($3)",
            &[
                (&workspace, Type::TEXT),
                (&kind, Type::TEXT),
                (&names, Type::TEXT_ARRAY),
            ],
        )?;
        let mut paused = HashSet::new();
        let mut saved = HashMap::new();
        for r in &rows {
            let name: String = col(r, 0)?;
            if col::<bool>(r, 4)? {
                paused.insert(name);
            } else {
                let stand: (i64, i64) = (col(r, 1)?, col(r, 2)?);
                saved.insert(name, (stand, col::<i64>(r, 3)?));
            }
        }
        Ok(names
            .iter()
            .map(|name| {
                if paused.contains(*name) {
                    return None;
                }
                Some(match saved.get(*name) {
                    Some(&(stand, high)) => (Some(stand), high),
                    None => (None, 0),
                })
            })
            .collect())
    }

    /// One round trip instead of four, on a generic plan the server keeps
    /// after its first five executions on a connection. The actions' names
    /// reach the planner as a subquery's value,
    /// not as the array itself: a plan for the array at hand (one name,
    /// say) costed the read of the actions' table below the generic plan's
    /// guess of ten names, so under the default `plan_cache_mode` the
    /// server planned the statement again at every claim and settlement:
    /// in the statement log of a `--quick` run of
    /// `pg_latency_enqueue_back_to_back`, its bind (where the plan is made)
    /// took 0.59 ms at the median, against 0.05 ms to run it, and 0.07 ms
    /// with the plan kept.
    fn claim_plan(&self, now: i64, actions: &[String]) -> Result<ClaimPlan> {
        let rows = self.query(
            &format!("WITH RECURSIVE limited AS ( \
               SELECT action, priority, max_running, rate_count, rate_period_ms, partition_by, fair \
               FROM reflexr_actions a \
               WHERE action = ANY ((SELECT $2::text[])::text[]) AND {LIMITED}), \
             p(v) AS ( \
               SELECT (SELECT priority FROM reflexr_runs WHERE state = 'ready' \
                       ORDER BY priority DESC LIMIT 1) \
               UNION ALL \
               SELECT (SELECT priority FROM reflexr_runs \
                       WHERE state = 'ready' AND priority < p.v ORDER BY priority DESC LIMIT 1) \
               FROM p WHERE p.v IS NOT NULL) \
             SELECT \
               ARRAY(SELECT name FROM reflexr_paused WHERE kind = 'action'), \
               ARRAY(SELECT v FROM p WHERE v IS NOT NULL ORDER BY v DESC), \
               EXISTS (SELECT 1 FROM reflexr_runs WHERE state = 'running' \
                         AND claim_expires_at <= $1), \
               ARRAY(SELECT action FROM limited ORDER BY action), \
               ARRAY(SELECT priority FROM limited ORDER BY action), \
               ARRAY(SELECT max_running FROM limited ORDER BY action), \
               ARRAY(SELECT rate_count FROM limited ORDER BY action), \
               ARRAY(SELECT rate_period_ms FROM limited ORDER BY action), \
               ARRAY(SELECT partition_by FROM limited ORDER BY action), \
               ARRAY(SELECT fair FROM limited ORDER BY action)"),
            &[(&now, Type::INT8), (&actions, Type::TEXT_ARRAY)],
        )?;
        let r = rows
            .first()
            .ok_or_else(|| Error::invalid("claim plan", "no row"))?;
        let paused: Vec<String> = col(r, 0)?;
        let names: Vec<String> = col(r, 3)?;
        let priorities: Vec<i64> = col(r, 4)?;
        let max_running: Vec<Option<i64>> = col(r, 5)?;
        let rate_count: Vec<Option<i64>> = col(r, 6)?;
        let rate_period_ms: Vec<Option<i64>> = col(r, 7)?;
        let partition_by: Vec<Option<String>> = col(r, 8)?;
        let fair: Vec<bool> = col(r, 9)?;
        let mut limited = Vec::with_capacity(names.len());
        for (i, action) in names.into_iter().enumerate() {
            limited.push(ActionRow {
                action,
                priority: priorities[i],
                max_running: limit(max_running[i])?,
                rate_count: limit(rate_count[i])?,
                rate_period_ms: rate_period_ms[i],
                partition_by: partition_by[i].clone(),
                fair: fair[i],
            });
        }
        Ok(ClaimPlan {
            paused: paused.into_iter().collect(),
            priorities: col(r, 1)?,
            lapsed: col(r, 2)?,
            limited,
        })
    }

    fn paused_names(&self, kind: &str) -> Result<HashSet<String>> {
        self.query(
            "SELECT name FROM reflexr_paused WHERE kind = $1",
            &[(&kind, Type::TEXT)],
        )?
        .iter()
        .map(|r| col(r, 0))
        .collect()
    }

    fn is_paused(&self, kind: &str, name: &str) -> Result<bool> {
        Ok(self
            .query_opt(
                "SELECT 1 FROM reflexr_paused WHERE kind = $1 AND name = $2",
                &[(&kind, Type::TEXT), (&name, Type::TEXT)],
            )?
            .is_some())
    }

    fn pause(
        &self,
        kind: &str,
        name: &str,
        now: i64,
        operator: &str,
        reason: &str,
    ) -> Result<bool> {
        Ok(self
            .query_opt(
                "INSERT INTO reflexr_paused (kind, name, since, operator, reason) \
                 VALUES ($1, $2, $3, $4, $5) ON CONFLICT (kind, name) DO NOTHING RETURNING 1",
                &[
                    (&kind, Type::TEXT),
                    (&name, Type::TEXT),
                    (&now, Type::INT8),
                    (&operator, Type::TEXT),
                    (&reason, Type::TEXT),
                ],
            )?
            .is_some())
    }

    fn resume(&self, kind: &str, name: &str) -> Result<bool> {
        Ok(self
            .query_opt(
                "DELETE FROM reflexr_paused WHERE kind = $1 AND name = $2 RETURNING 1",
                &[(&kind, Type::TEXT), (&name, Type::TEXT)],
            )?
            .is_some())
    }

    fn paused(&self) -> Result<Vec<PausedRow>> {
        self.query(
            "SELECT kind, name, since, operator, reason FROM reflexr_paused ORDER BY kind, name",
            &[],
        )?
        .iter()
        .map(|r| Ok((col(r, 0)?, col(r, 1)?, col(r, 2)?, col(r, 3)?, col(r, 4)?)))
        .collect()
    }

    fn configure_action(&self, a: &ActionRow, key_path: Option<&str>, now: i64) -> Result<()> {
        let max_running = a.max_running.map(i64::from);
        let rate_count = a.rate_count.map(i64::from);
        let key_path = key_path.map(path_elements).transpose()?;
        self.query(
            &format!(
                "INSERT INTO reflexr_actions ({ACTION_COLUMNS}, key_path, updated_at) \
                 VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9) \
                 ON CONFLICT (action) DO UPDATE SET priority = excluded.priority, \
                   max_running = excluded.max_running, rate_count = excluded.rate_count, \
                   rate_period_ms = excluded.rate_period_ms, \
                   partition_by = excluded.partition_by, fair = excluded.fair, \
                   key_path = excluded.key_path, updated_at = excluded.updated_at"
            ),
            &[
                (&a.action, Type::TEXT),
                (&a.priority, Type::INT8),
                (&max_running, Type::INT8),
                (&rate_count, Type::INT8),
                (&a.rate_period_ms, Type::INT8),
                (&a.partition_by, Type::TEXT),
                (&a.fair, Type::BOOL),
                (&key_path, Type::TEXT_ARRAY),
                (&now, Type::INT8),
            ],
        )?;
        Ok(())
    }

    fn key_runs(&self, action: &str, key_path: Option<&str>) -> Result<usize> {
        let key_path = key_path.map(path_elements).transpose()?;
        Ok(self
            .query(
                "UPDATE reflexr_runs SET flow_key = coalesce(input::jsonb #>> $2, '') \
                 WHERE action = $1 AND flow_key IS NULL \
                   AND state IN ('waiting', 'ready', 'running') RETURNING 1",
                &[(&action, Type::TEXT), (&key_path, Type::TEXT_ARRAY)],
            )?
            .len())
    }

    fn action_row(&self, action: &str) -> Result<Option<ActionRow>> {
        self.query_opt(
            &format!("SELECT {ACTION_COLUMNS} FROM reflexr_actions WHERE action = $1"),
            &[(&action, Type::TEXT)],
        )?
        .map(|r| action_from(&r))
        .transpose()
    }

    fn set_key_row(&self, k: &KeyRow) -> Result<()> {
        let max_running = k.max_running.map(i64::from);
        let rate_count = k.rate_count.map(i64::from);
        let weight = k.weight.map(i64::from);
        self.query(
            &format!(
                "INSERT INTO reflexr_action_keys ({KEY_COLUMNS}) \
                 VALUES ($1, $2, $3, $4, $5, $6, $7) \
                 ON CONFLICT (action, key) DO UPDATE SET max_running = excluded.max_running, \
                   rate_count = excluded.rate_count, rate_period_ms = excluded.rate_period_ms, \
                   weight = excluded.weight, updated_at = excluded.updated_at"
            ),
            &[
                (&k.action, Type::TEXT),
                (&k.key, Type::TEXT),
                (&max_running, Type::INT8),
                (&rate_count, Type::INT8),
                (&k.rate_period_ms, Type::INT8),
                (&weight, Type::INT8),
                (&k.updated_at, Type::INT8),
            ],
        )?;
        Ok(())
    }

    fn delete_key_row(&self, action: &str, key: &str) -> Result<bool> {
        Ok(self
            .query_opt(
                "DELETE FROM reflexr_action_keys WHERE action = $1 AND key = $2 RETURNING 1",
                &[(&action, Type::TEXT), (&key, Type::TEXT)],
            )?
            .is_some())
    }

    fn key_rows(&self, action: Option<&str>) -> Result<Vec<KeyRow>> {
        self.query(
            &format!(
                "SELECT {KEY_COLUMNS} FROM reflexr_action_keys \
                 WHERE $1::text IS NULL OR action = $1 ORDER BY action, key"
            ),
            &[(&action, Type::TEXT)],
        )?
        .iter()
        .map(key_from)
        .collect()
    }

    /// A loose index scan of `reflexr_runs_keyed`: from each key's first
    /// entry (its oldest ready run) to the next key's, one seek each.
    fn fair_heads(&self, action: &str, priority: i64, now: i64) -> Result<Vec<(String, i64)>> {
        self.query(
            "WITH RECURSIVE k AS ( \
               (SELECT flow_key, due_at, ord FROM reflexr_runs \
                WHERE state = 'ready' AND flow_key IS NOT NULL AND action = $1 AND priority = $2 \
                ORDER BY flow_key, due_at, ord LIMIT 1) \
               UNION ALL \
               SELECT n.flow_key, n.due_at, n.ord FROM k, LATERAL ( \
                 SELECT flow_key, due_at, ord FROM reflexr_runs \
                 WHERE state = 'ready' AND flow_key IS NOT NULL AND action = $1 AND priority = $2 \
                   AND flow_key > k.flow_key \
                 ORDER BY flow_key, due_at, ord LIMIT 1) n) \
             SELECT flow_key, ord FROM k WHERE due_at <= $3",
            &[
                (&action, Type::TEXT),
                (&priority, Type::INT8),
                (&now, Type::INT8),
            ],
        )?
        .iter()
        .map(|r| Ok((col(r, 0)?, col(r, 1)?)))
        .collect()
    }

    fn key_ords(
        &self,
        action: &str,
        key: &str,
        priority: i64,
        now: i64,
        limit: usize,
    ) -> Result<Vec<i64>> {
        let limit = i64::try_from(limit).unwrap_or(i64::MAX);
        self.query(
            "SELECT ord FROM reflexr_runs \
             WHERE state = 'ready' AND flow_key IS NOT NULL AND action = $1 AND priority = $2 \
               AND flow_key = $3 AND due_at <= $4 \
             ORDER BY due_at, ord LIMIT $5",
            &[
                (&action, Type::TEXT),
                (&priority, Type::INT8),
                (&key, Type::TEXT),
                (&now, Type::INT8),
                (&limit, Type::INT8),
            ],
        )?
        .iter()
        .map(|r| col(r, 0))
        .collect()
    }

    fn fair_state(&self, action: &str) -> Result<FairState> {
        let clock: f64 = self
            .query_opt(
                "SELECT fair_clock FROM reflexr_actions WHERE action = $1",
                &[(&action, Type::TEXT)],
            )?
            .map_or(Ok(0.0), |r| col(&r, 0))?;
        let passes = self
            .query(
                "SELECT key, pass FROM reflexr_key_passes WHERE action = $1 AND pass > $2",
                &[(&action, Type::TEXT), (&clock, Type::FLOAT8)],
            )?
            .iter()
            .map(|r| Ok((col(r, 0)?, col(r, 1)?)))
            .collect::<Result<Vec<_>>>()?;
        Ok(FairState { clock, passes })
    }

    fn save_fair(&self, action: &str, clock: f64, passes: &[(String, f64)]) -> Result<()> {
        let keys: Vec<&str> = passes.iter().map(|(k, _)| k.as_str()).collect();
        let values: Vec<f64> = passes.iter().map(|(_, p)| *p).collect();
        self.query(
            "WITH c AS (UPDATE reflexr_actions SET fair_clock = $2 WHERE action = $1), \
                  d AS (DELETE FROM reflexr_key_passes WHERE action = $1 AND pass <= $2 \
                          AND NOT (key = ANY ($3))) \
             INSERT INTO reflexr_key_passes (action, key, pass) \
             SELECT $1, k, p FROM unnest($3::text[], $4::float8[]) AS t(k, p) \
             ON CONFLICT (action, key) DO UPDATE SET pass = excluded.pass",
            &[
                (&action, Type::TEXT),
                (&clock, Type::FLOAT8),
                (&keys, Type::TEXT_ARRAY),
                (&values, Type::FLOAT8_ARRAY),
            ],
        )?;
        Ok(())
    }

    fn key_counts(&self, action: &str) -> Result<Vec<(String, String, i64)>> {
        self.query(
            "SELECT flow_key, state, count(*) FROM reflexr_runs \
             WHERE action = $1 AND flow_key IS NOT NULL \
               AND state IN ('waiting', 'ready', 'running') \
             GROUP BY flow_key, state ORDER BY flow_key, state",
            &[(&action, Type::TEXT)],
        )?
        .iter()
        .map(|r| Ok((col(r, 0)?, col(r, 1)?, col(r, 2)?)))
        .collect()
    }

    fn action_rows(&self) -> Result<Vec<ActionRow>> {
        self.query(
            &format!("SELECT {ACTION_COLUMNS} FROM reflexr_actions ORDER BY action"),
            &[],
        )?
        .iter()
        .map(action_from)
        .collect()
    }

    /// One round trip instead of two.
    fn limited(&self, actions: &[String]) -> Result<Vec<ActionRow>> {
        self.query(
            &format!(
                "SELECT {ACTION_COLUMNS} FROM reflexr_actions a WHERE action = ANY ($1) \
                   AND {LIMITED}"
            ),
            &[(&actions, Type::TEXT_ARRAY)],
        )?
        .iter()
        .map(action_from)
        .collect()
    }

    fn ready_priorities(&self) -> Result<Vec<i64>> {
        // A loose index scan: one seek per priority, however many runs.
        self.query(
            "WITH RECURSIVE p(v) AS ( \
               SELECT (SELECT priority FROM reflexr_runs WHERE state = 'ready' \
                       ORDER BY priority DESC LIMIT 1) \
               UNION ALL \
               SELECT (SELECT priority FROM reflexr_runs \
                       WHERE state = 'ready' AND priority < p.v ORDER BY priority DESC LIMIT 1) \
               FROM p WHERE p.v IS NOT NULL) \
             SELECT v FROM p WHERE v IS NOT NULL",
            &[],
        )?
        .iter()
        .map(|r| col(r, 0))
        .collect()
    }

    fn candidates(
        &self,
        action: &str,
        now: i64,
        priority: i64,
        full: &[String],
        after: (i64, i64),
        limit: usize,
    ) -> Result<Vec<(i64, i64, String)>> {
        let limit = i64::try_from(limit).unwrap_or(i64::MAX);
        self.query(
            "SELECT ord, due_at, coalesce(flow_key, '') FROM reflexr_runs \
             WHERE state = 'ready' AND priority = $3 AND due_at <= $2 AND action = $1 \
               AND (due_at, ord) > ($4, $5) AND NOT (coalesce(flow_key, '') = ANY ($6)) \
             ORDER BY due_at, ord LIMIT $7",
            &[
                (&action, Type::TEXT),
                (&now, Type::INT8),
                (&priority, Type::INT8),
                (&after.0, Type::INT8),
                (&after.1, Type::INT8),
                (&full, Type::TEXT_ARRAY),
                (&limit, Type::INT8),
            ],
        )?
        .iter()
        .map(|r| Ok((col(r, 0)?, col(r, 1)?, col(r, 2)?)))
        .collect()
    }

    fn claim_fresh(
        &self,
        holder: &str,
        now: i64,
        expires_at: i64,
        id: &str,
    ) -> Result<Option<RunRow>> {
        self.claim_fresh_row(holder, now, expires_at, id)
    }

    fn hand_over_fresh(
        &self,
        action: &str,
        holder: &str,
        now: i64,
        expires_at: i64,
        id: &str,
    ) -> Result<(bool, Option<RunRow>)> {
        // One statement: whether the action may, then the claimed run's
        // columns (null when none was claimed).
        let row = self
            .query_opt(
                &super::runs::HAND_OVER_FRESH_SQL,
                &[
                    (&holder, Type::TEXT),
                    (&now, Type::INT8),
                    (&expires_at, Type::INT8),
                    (&id, Type::TEXT),
                    (&action, Type::TEXT),
                ],
            )?
            .ok_or_else(|| Error::invalid("hand-over", "no row"))?;
        let claimed: Option<i64> = col(&row, 1)?;
        let run = match claimed {
            Some(_) => Some(super::runs::run_from_at(&row, 1)?),
            None => None,
        };
        Ok((col(&row, 0)?, run))
    }

    fn insert_handed_at_once(
        &self,
        run: &NewRun<'_>,
        holder: &str,
        expires_at: i64,
    ) -> Result<Option<(Inserted, bool, Option<RunRow>)>> {
        self.insert_handed_row(run, holder, expires_at)
    }

    fn claim_ords(
        &self,
        holder: &str,
        now: i64,
        expires_at: i64,
        ords: &[i64],
    ) -> Result<Vec<RunRow>> {
        self.claim_picked(holder, now, expires_at, ords)
    }

    /// An advisory lock per action, held to the commit: claimers of many
    /// processes count one limited action's running runs and starts one
    /// at a time (they take the locks in the actions' order, so they never
    /// wait for each other in a circle).
    fn lock_limits(&self, action: &str) -> Result<()> {
        self.query(
            "SELECT pg_advisory_xact_lock($1, hashtext($2))",
            &[(&LIMIT_LOCK, Type::INT4), (&action, Type::TEXT)],
        )?;
        Ok(())
    }

    fn running_by(&self, action: &str, keyed: bool) -> Result<Vec<(String, i64)>> {
        if !keyed {
            let n: i64 = self
                .query(
                    "SELECT count(*) FROM reflexr_runs WHERE state = 'running' AND action = $1",
                    &[(&action, Type::TEXT)],
                )?
                .first()
                .map_or(Ok(0), |r| col(r, 0))?;
            return Ok(vec![(String::new(), n)]);
        }
        self.query(
            "SELECT coalesce(flow_key, ''), count(*) FROM reflexr_runs \
             WHERE state = 'running' AND action = $1 GROUP BY 1",
            &[(&action, Type::TEXT)],
        )?
        .iter()
        .map(|r| Ok((col(r, 0)?, col(r, 1)?)))
        .collect()
    }

    fn starts_since(&self, action: &str, since: i64, forget: i64) -> Result<Vec<(String, i64)>> {
        self.query(
            "DELETE FROM reflexr_starts WHERE action = $1 AND at <= $2",
            &[(&action, Type::TEXT), (&forget, Type::INT8)],
        )?;
        self.query(
            "SELECT part, sum(n)::bigint FROM reflexr_starts WHERE action = $1 AND at > $2 \
             GROUP BY part",
            &[(&action, Type::TEXT), (&since, Type::INT8)],
        )?
        .iter()
        .map(|r| Ok((col(r, 0)?, col(r, 1)?)))
        .collect()
    }

    fn key_starts_since(&self, action: &str, key: &str, since: i64) -> Result<i64> {
        self.query(
            "SELECT coalesce(sum(n), 0)::bigint FROM reflexr_starts \
             WHERE action = $1 AND part = $2 AND at > $3",
            &[
                (&action, Type::TEXT),
                (&key, Type::TEXT),
                (&since, Type::INT8),
            ],
        )?
        .first()
        .map_or(Ok(0), |r| col(r, 0))
    }

    fn record_starts(&self, action: &str, part: &str, at: i64, n: i64) -> Result<()> {
        self.query(
            "INSERT INTO reflexr_starts (action, part, at, n) VALUES ($1, $2, $3, $4)",
            &[
                (&action, Type::TEXT),
                (&part, Type::TEXT),
                (&at, Type::INT8),
                (&n, Type::INT8),
            ],
        )?;
        Ok(())
    }

    fn work_due(&self, now: i64, actions: &[&String]) -> Result<bool> {
        let names: Vec<&str> = actions.iter().map(|a| a.as_str()).collect();
        let row = self.query(WORK_DUE, &[(&now, Type::INT8), (&names, Type::TEXT_ARRAY)])?;
        row.first().map_or(Ok(false), |r| col(r, 0))
    }

    /// [`IDLE_LOOK`]: one round trip where the look's reads were three.
    fn work_due_at_once(&self, now: i64, actions: &[String]) -> Result<Option<(bool, bool)>> {
        let row = self
            .query_opt(
                IDLE_LOOK,
                &[(&now, Type::INT8), (&actions, Type::TEXT_ARRAY)],
            )?
            .ok_or_else(|| Error::invalid("idle look", "no row"))?;
        let (due, waits, behind): (bool, bool, bool) =
            (col(&row, 0)?, col(&row, 1)?, col(&row, 2)?);
        Ok(Some((due || (waits && behind), waits)))
    }

    fn sweep_control(&self, now: i64) -> Result<usize> {
        let periods = self
            .query(
                "DELETE FROM reflexr_unique_periods WHERE until <= $1 RETURNING 1",
                &[(&now, Type::INT8)],
            )?
            .len();
        let starts = self
            .query(
                "DELETE FROM reflexr_starts WHERE NOT EXISTS (SELECT 1 FROM reflexr_actions a \
                   WHERE a.action = reflexr_starts.action AND a.rate_count IS NOT NULL \
                     AND reflexr_starts.at > $1 - a.rate_period_ms) \
                 AND NOT EXISTS (SELECT 1 FROM reflexr_action_keys k \
                   WHERE k.action = reflexr_starts.action AND k.rate_count IS NOT NULL \
                     AND reflexr_starts.at > $1 - k.rate_period_ms) RETURNING 1",
                &[(&now, Type::INT8)],
            )?
            .len();
        Ok(periods + starts)
    }

    fn lapsed_due(&self, now: i64) -> Result<bool> {
        let row = self.query(
            "SELECT EXISTS (SELECT 1 FROM reflexr_runs WHERE state = 'running' \
                              AND claim_expires_at <= $1)",
            &[(&now, Type::INT8)],
        )?;
        row.first().map_or(Ok(false), |r| col(r, 0))
    }
}

#[cfg(test)]
mod tests {
    use super::path_elements;

    #[test]
    fn a_json_path_becomes_jsonb_path_elements() {
        let els = |p: &str| path_elements(p).unwrap();
        assert_eq!(els("$.\"customer\""), ["customer"]);
        assert_eq!(els("$.a.b"), ["a", "b"]);
        assert_eq!(els("$.\"a b\".c[2]"), ["a b", "c", "2"]);
        assert_eq!(els("$.list[#-1]"), ["list", "-1"]);
        assert!(els("$").is_empty());
        assert!(path_elements("a.b").is_err());
        assert!(path_elements("$.\"open").is_err());
    }
}
