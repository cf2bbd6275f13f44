//! Named points where a test can make the daemon die as a power cut would.
//!
//! Crash recovery is only as good as the crashes it was tried against, and a
//! `kill -9` at a random moment rarely lands inside a 20 ms window. When the
//! daemon's environment has `AIRLOCK_CRASH_AT=<point>`, reaching that point
//! kills the daemon with SIGKILL on the spot: no destructor, no flush, exactly
//! what the recovery code must handle. Unset (always, outside tests) it costs
//! one comparison.

use std::sync::OnceLock;

/// The environment variable naming the point to die at.
pub const ENV: &str = "AIRLOCK_CRASH_AT";

/// Dies here if this is the point the environment names.
pub fn reached(point: &str) {
    static CHOSEN: OnceLock<Option<String>> = OnceLock::new();
    let chosen = CHOSEN.get_or_init(|| std::env::var(ENV).ok().filter(|p| !p.is_empty()));
    if chosen.as_deref() == Some(point) {
        tracing::error!(point, "dying at a crash point, as {ENV} asked");
        let _ = nix::sys::signal::kill(nix::unistd::Pid::this(), nix::sys::signal::Signal::SIGKILL);
    }
}
