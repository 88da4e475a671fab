//! reflexr's integration tests: one binary, one module per concern, each
//! test naming the DESIGN.md invariant it checks. The fixtures are
//! `reflexr-testkit`'s; a test written once for every backend runs on an
//! SQLite temp file and, with the feature `postgres`, on PostgreSQL
//! (`on_backends!`); the PostgreSQL-only tests are in `pg/`. Child
//! processes are this binary re-run on one test.

mod bad_input;
mod control;
mod crash;
mod cursors;
mod docs;
mod faults;
mod follow;
mod inspect;
mod jobs;
mod keys;
mod layers;
mod leases;
mod log;
mod multiprocess;
mod notify;
mod observe;
mod open;
#[cfg(feature = "otlp")]
mod otel;
mod pacing;
#[cfg(feature = "postgres")]
mod pg;
mod power;
mod rules;
mod runs;
mod runtime;
mod shared;
mod versions;
mod workflow;
