//! A delivery channel the loop tests share (`tests/it/jobs.rs`), generic
//! over the backend.

use std::sync::{Arc, Mutex};

use reflexr::{Backend, ChannelPolicy, Engine};

/// The recipients of the messages a channel sent, in order.
pub type Sent = Arc<Mutex<Vec<String>>>;

/// Registers the `email` channel with `policy`, recording each message's
/// recipient.
pub fn email_channel<B: Backend>(e: &Engine<B>, policy: ChannelPolicy) -> Sent {
    let sent: Sent = Arc::default();
    let s = Arc::clone(&sent);
    e.register_channel("email", policy, move |msg, _| {
        s.lock().unwrap().push(msg.to.clone().unwrap_or_default());
        Ok(())
    })
    .unwrap();
    sent
}
