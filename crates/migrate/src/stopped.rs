//! Why a test fork's server stopped under a candidate, read from its log.

/// The words of the kernel's error when the server's log says it stopped on
/// a full disk or quota: a `PANIC` (a failed write of the WAL is one, and it
/// ends every session with no error of its own) naming ENOSPC or EDQUOT.
/// Only a line whose own level is `PANIC` counts, never a message that holds
/// the word (`ERROR:  PANIC: ...` raised by a candidate).
pub(crate) fn on_full_disk(log_tail: &str) -> Option<&'static str> {
    const LEVELS: [&str; 10] = [
        "DEBUG",
        "LOG:",
        "INFO:",
        "NOTICE:",
        "WARNING:",
        "ERROR:",
        "FATAL:",
        "PANIC:",
        "DETAIL:",
        "STATEMENT:",
    ];
    let level = |line: &str| LEVELS.iter().filter_map(|l| line.find(l).map(|at| (at, *l))).min();
    log_tail
        .lines()
        .filter(|line| level(line).is_some_and(|(_, l)| l == "PANIC:"))
        .find_map(|line| airlock_core::error::DISK_FULL_WORDS.into_iter().find(|w| line.contains(w)))
}

#[cfg(test)]
mod tests {
    use super::on_full_disk;

    #[test]
    fn a_panic_on_a_full_quota_is_told_and_a_raised_message_is_not() {
        let log = "2026-12-07 04:59:21.1 UTC [88] LOG:  checkpoint starting: wal\n\
                   2026-12-07 04:59:21.3 UTC [91] PANIC:  could not write to file \"pg_wal/xlogtemp.91\": Disk quota exceeded\n\
                   2026-12-07 04:59:21.3 UTC [90] LOG:  server process (PID 91) was terminated by signal 6: Aborted";
        assert_eq!(on_full_disk(log), Some("Disk quota exceeded"));
        let enospc = "[7] PANIC:  could not extend file \"base/5/16384\": No space left on device";
        assert_eq!(on_full_disk(enospc), Some("No space left on device"));
        // A candidate's own words, at another level, and a PANIC of another cause.
        assert_eq!(on_full_disk("[9] ERROR:  PANIC:  Disk quota exceeded"), None);
        assert_eq!(on_full_disk("[9] LOG:  statement: SELECT 'PANIC:  No space left on device'"), None);
        assert_eq!(on_full_disk("[9] PANIC:  could not locate a valid checkpoint record"), None);
        assert_eq!(on_full_disk(""), None);
    }
}
