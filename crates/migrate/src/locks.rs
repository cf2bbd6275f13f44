//! PostgreSQL's table lock modes as the report names them (`ACCESS
//! EXCLUSIVE`...): what each makes other sessions wait for, and which lock
//! makes another on the same table redundant.

use super::report::StatementReport;

/// The modes from weakest to strongest, as PostgreSQL's documentation
/// lists them; a mode's bit is its place here.
const MODES: [&str; 8] = [
    "ACCESS SHARE",
    "ROW SHARE",
    "ROW EXCLUSIVE",
    "SHARE UPDATE EXCLUSIVE",
    "SHARE",
    "SHARE ROW EXCLUSIVE",
    "EXCLUSIVE",
    "ACCESS EXCLUSIVE",
];

/// For each mode of `MODES`, the modes it conflicts with, as bits of their
/// places (PostgreSQL's table of conflicting lock modes).
const CONFLICTS: [u8; 8] = [
    0b1000_0000, // ACCESS SHARE: ACCESS EXCLUSIVE
    0b1100_0000, // ROW SHARE: EXCLUSIVE and up
    0b1111_0000, // ROW EXCLUSIVE: SHARE and up
    0b1111_1000, // SHARE UPDATE EXCLUSIVE: itself and up
    0b1110_1100, // SHARE: ROW EXCLUSIVE, SHARE UPDATE EXCLUSIVE, SHARE ROW EXCLUSIVE and up
    0b1111_1100, // SHARE ROW EXCLUSIVE: ROW EXCLUSIVE and up
    0b1111_1110, // EXCLUSIVE: ROW SHARE and up
    0b1111_1111, // ACCESS EXCLUSIVE: everything
];

/// The modes `mode` conflicts with; none for a mode not known.
fn conflicts(mode: &str) -> u8 {
    MODES.iter().position(|m| *m == mode).map_or(0, |i| CONFLICTS[i])
}

/// Whether `mode` makes plain reads (`SELECT`, which takes ACCESS SHARE) wait.
pub fn blocks_reads(mode: &str) -> bool {
    conflicts(mode) & 1 != 0
}

/// Whether holding `stronger` makes `weaker` on the same table redundant:
/// everything `weaker` would make wait, `stronger` makes wait already.
pub fn subsumes(stronger: &str, weaker: &str) -> bool {
    let (s, w) = (conflicts(stronger), conflicts(weaker));
    s != 0 && s & w == w
}

/// Leaves out of each statement's locks one that another lock of the same
/// statement on the same relation subsumes: a rewrite's SHARE beside its
/// ACCESS EXCLUSIVE says nothing more. Of two equal ones, the first stays.
pub fn drop_subsumed(statements: &mut [StatementReport]) {
    for s in statements {
        let locks = std::mem::take(&mut s.locks);
        for (i, lock) in locks.iter().enumerate() {
            let redundant = locks.iter().enumerate().any(|(j, other)| {
                j != i
                    && other.relation == lock.relation
                    && subsumes(&other.mode, &lock.mode)
                    && (!subsumes(&lock.mode, &other.mode) || j < i)
            });
            if !redundant {
                s.locks.push(lock.clone());
            }
        }
    }
}

/// What waits while statement `i` of `statements` runs on `table`, by the
/// locks its transaction holds then: `reads and writes`, or `writes`.
pub fn what_waits(statements: &[StatementReport], i: usize, table: &str) -> &'static str {
    // Locks are listed on the statement that took them, and held to the end
    // of its transaction: an earlier statement of the same one may hold it.
    let txn = statements[i].txn;
    let held = statements[..=i].iter().filter(|s| s.txn == txn).flat_map(|s| &s.locks);
    if held.into_iter().any(|l| l.relation == table && blocks_reads(&l.mode)) {
        "reads and writes"
    } else {
        "writes"
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_stronger_lock_makes_a_weaker_one_redundant_only_when_it_blocks_everything_the_weaker_does() {
        assert!(subsumes("ACCESS EXCLUSIVE", "SHARE"));
        assert!(subsumes("SHARE ROW EXCLUSIVE", "SHARE"));
        assert!(subsumes("SHARE ROW EXCLUSIVE", "SHARE UPDATE EXCLUSIVE"));
        assert!(subsumes("EXCLUSIVE", "ROW SHARE"));
        // SHARE lets SHARE in and stops ROW EXCLUSIVE; SHARE UPDATE EXCLUSIVE the other way about.
        assert!(!subsumes("SHARE", "SHARE UPDATE EXCLUSIVE") && !subsumes("SHARE UPDATE EXCLUSIVE", "SHARE"));
        assert!(!subsumes("SHARE", "ACCESS EXCLUSIVE"));
        assert!(!subsumes("NO SUCH MODE", "ACCESS SHARE"));
        assert!(blocks_reads("ACCESS EXCLUSIVE"));
        assert!(!blocks_reads("EXCLUSIVE") && !blocks_reads("SHARE"));
        // Each mode conflicts with a mode exactly when that mode conflicts with it.
        for (i, row) in CONFLICTS.iter().enumerate() {
            for (j, other) in CONFLICTS.iter().enumerate() {
                assert_eq!(row >> j & 1, other >> i & 1, "{} / {}", MODES[i], MODES[j]);
            }
        }
    }
}
