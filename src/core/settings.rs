//! The settings fixed when a file is opened that the core's operations
//! consult: durability, waiting, leases, and the limits on what is stored.
//! The builder's documentation gives their defaults
//! ([`crate::Builder`]).

use std::time::Duration;

use crate::base::durability::Synchronous;

/// How the core works on one open file.
#[derive(Debug, Clone)]
pub struct Settings {
    pub synchronous: Synchronous,
    /// How long a write waits for another process's lock, and a read for a
    /// busy file.
    pub busy_timeout: Duration,
    /// How often a waiting thread looks for other processes' commits (and
    /// for runs and schedules coming due).
    pub heartbeat: Duration,
    /// Whether the application chose the heartbeat (else it is the default
    /// for the file: longer when the WAL watch runs).
    pub heartbeat_set: bool,
    /// How long the engine's leases (and runs' claims) last unless renewed.
    pub lease_ttl: Duration,
    /// The name this engine holds leases and claims under.
    pub holder_id: String,
    pub limits: Limits,
    /// What upcasts an old version of a type when events are handed out.
    pub upcasters: crate::base::upcast::Upcasters,
    /// What merges a debounced run's input with the next enqueue's, by
    /// action (else the last input wins).
    pub(crate) mergers: crate::base::merge::Mergers,
    /// The spans and metrics the engine makes (feature `otel`).
    pub(crate) telemetry: crate::base::telemetry::Telemetry,
}

/// The limits on what the engine stores.
#[derive(Debug, Clone, Copy)]
pub struct Limits {
    /// The largest payload, run input, checkpoint or rule state, in bytes.
    pub max_payload_bytes: usize,
    /// The deepest chain of causes a run may extend.
    pub max_chain_depth: i64,
}

impl Settings {
    /// For the core's own tests, on either backend: the defaults, a
    /// 50 ms heartbeat and the holder `test`.
    #[cfg(test)]
    pub(crate) fn for_test() -> Settings {
        Settings {
            synchronous: Synchronous::Full,
            busy_timeout: Duration::from_secs(20),
            heartbeat: Duration::from_millis(50),
            heartbeat_set: true,
            lease_ttl: Duration::from_secs(30),
            holder_id: "test".into(),
            limits: Limits {
                max_payload_bytes: 1 << 20,
                max_chain_depth: 8,
            },
            upcasters: Default::default(),
            mergers: Default::default(),
            telemetry: Default::default(),
        }
    }

    /// A lease's (or a claim's) time to live, in ms.
    pub(crate) fn lease_ttl_ms(&self) -> i64 {
        i64::try_from(self.lease_ttl.as_millis()).unwrap_or(i64::MAX)
    }
}
