//! Values as they were before a candidate ran, read on a second fork of the
//! test's golden generation that nothing has run on, made only once the
//! candidate has run and shown that it updated columns no statement names
//! ([`super::overwrite::unnamed`]).
//!
//! Every such column is read first as a 64-bit hash alone (cheaper for the
//! server than an MD5, and 16 bytes a value here), so a wide table costs
//! little; only the columns that lost values are read again with their
//! text, for the message. A table the candidate grew past twice
//! its golden rows is compared by counts instead, so the daemon never holds
//! rows in proportion to what the candidate wrote.

use std::collections::{BTreeMap, BTreeSet};
use std::sync::Arc;

use airlock_core::dsn::DATABASE;
use airlock_core::error::{Error, Result};
use airlock_lifecycle::engine::Engine;
use airlock_lifecycle::sandbox::Sandbox;
use airlock_postgres::admin::Admin;
use airlock_postgres::catalog::{Catalog, Snapshot};
use airlock_postgres::cell::Cell as _;

use super::overwrite::unnamed::{self, Unnamed};
use super::overwrite::{
    by_pairing, counted_losses, counts, losses, names, read, read_bounded, Reading as Read,
};
use super::overwrite::{Loss, Target, Values};
use super::verify::Shape;
use super::TestRequest;

/// The format the reader writes a timestamp's first 19 characters in.
const FORMAT: &str = "YYYY-MM-DD HH24:MI:SS";

/// The server's time now, as the reader writes a timestamp (UTC).
pub(crate) async fn clock(admin: &Admin) -> Result<String> {
    let row = admin
        .client()
        .query_one(
            &format!(
                "SELECT pg_catalog.to_char(pg_catalog.clock_timestamp() AT TIME ZONE 'UTC', '{FORMAT}')"
            ),
            &[],
        )
        .await
        .map_err(|e| Error::postgres(airlock_postgres::admin::describe(&e)))?;
    row.cell(0)
}

/// When the candidate ran: from its start to now, in UTC, and the same
/// widened by the most a time zone is off UTC, for times written without a
/// zone (`timestamp`), which a session in another zone writes in its own.
pub(crate) struct Window {
    /// In UTC.
    pub utc: (String, String),
    /// Fourteen hours wider each way.
    pub any_zone: (String, String),
}

impl Window {
    /// From `began` (as [`clock`] wrote it) to now.
    pub(crate) async fn now(admin: &Admin, began: &str) -> Result<Window> {
        let row = admin
            .client()
            .query_one(
                &format!(
                    "SELECT pg_catalog.to_char(pg_catalog.clock_timestamp() AT TIME ZONE 'UTC', '{FORMAT}'),
                            pg_catalog.to_char($1::text::timestamp - interval '14 hours', '{FORMAT}'),
                            pg_catalog.to_char(pg_catalog.clock_timestamp() AT TIME ZONE 'UTC' + interval '14 hours', '{FORMAT}')"
                ),
                &[&began],
            )
            .await
            .map_err(|e| Error::postgres(airlock_postgres::admin::describe(&e)))?;
        Ok(Window { utc: (began.to_owned(), row.cell(0)?), any_zone: (row.cell(1)?, row.cell(2)?) })
    }
}

/// A second fork being made, on a task of its own (so a test given up
/// meanwhile still ends with it deleted, never half-made).
pub(crate) type Making = tokio::task::JoinHandle<Result<(super::TestFork, Sandbox)>>;

/// Starts making a second fork of the test's golden.
pub(crate) fn make(engine: &Arc<Engine>, req: &TestRequest) -> Making {
    let (engine, req) = (engine.clone(), req.clone());
    let door = airlock_core::events::Door::current();
    tokio::spawn(airlock_core::events::DOOR.scope(door, async move { super::test_fork(&engine, &req).await }))
}

/// What reading on a second fork needs of the test.
pub(crate) struct Reading<'a> {
    pub engine: &'a Arc<Engine>,
    /// The test's own fork, the candidate run on it.
    pub first: &'a Sandbox,
    /// An admin session on it.
    pub admin: &'a Admin,
    pub shape: &'a Shape,
    /// The tables whose rows can be paired by the golden's key.
    pub compared: &'a BTreeSet<String>,
}

impl Reading<'_> {
    /// What the candidate overwrote in the columns of `unnamed`: their
    /// values before (of the columns that lost some), and the losses, less
    /// those of a column of timestamps that every changed row now holds the
    /// time of the run in (a stamp of the change). Nothing when the golden
    /// has moved on to another generation meanwhile (the second fork would
    /// not hold what the first did).
    pub(crate) async fn unnamed_losses(
        &self,
        making: Making,
        unnamed: Unnamed,
        snapshot: &Snapshot,
        now: &Catalog,
        window: &Window,
    ) -> Result<(BTreeMap<String, Values>, Vec<Loss>)> {
        let rows: BTreeMap<String, i64> = snapshot.rows.iter().map(|(k, v)| (k.clone(), v.rows)).collect();
        // Tables no statement names: row by row within the budget, else by
        // counts. Other columns of tables a statement names: row by row only.
        let (whole, mut counted) = by_pairing(unnamed.whole, self.shape, self.compared);
        let (rest, _) = by_pairing(unnamed.rest, self.shape, self.compared);
        let rest_tables: BTreeSet<String> = rest.iter().map(|t| t.table.clone()).collect();
        let (paired, too_wide) = unnamed::within_budget(whole.into_iter().chain(rest).collect(), &rows);
        counted.extend(too_wide.into_iter().filter(|t| !rest_tables.contains(&t.table)));
        let (pristine, second) = making
            .await
            .map_err(|e| Error::internal(format!("making a migration test's second fork failed ({e})")))??;
        let read = async {
            if second.generation != self.first.generation {
                return Ok(None);
            }
            let dir = self.engine.layout.sandbox_instance(&second.id);
            let other = Admin::connect(&dir, DATABASE, second.pid.unwrap_or_default()).await?;
            self.read_both(&other, paired, counted, (snapshot, now), &rows).await.map(Some)
        }
        .await;
        pristine.delete().await;
        let Some((before, found)) = read? else { return Ok((BTreeMap::new(), vec![])) };
        let type_of = |l: &Loss| {
            let t = snapshot.catalog.tables.get(&l.table)?;
            t.columns.iter().find(|c| c.name == l.column).map(|c| c.type_name.clone())
        };
        let found = found
            .into_iter()
            .filter(|l| {
                let (utc, any) = (&window.utc, &window.any_zone);
                !unnamed::stamped(l, &type_of(l).unwrap_or_default(), (&utc.0, &utc.1), (&any.0, &any.1))
            })
            .collect();
        Ok((before, found))
    }

    /// Reads `paired` (hashes first, then the text of the columns that lost
    /// values) and `counted` on `other` (the second fork) and on the test's
    /// fork, and judges them.
    async fn read_both(
        &self,
        other: &Admin,
        paired: Vec<Target>,
        mut counted: Vec<Target>,
        (snapshot, now): (&Snapshot, &Catalog),
        rows: &BTreeMap<String, i64>,
    ) -> Result<(BTreeMap<String, Values>, Vec<Loss>)> {
        let golden_key = |table: &str| self.shape.key(table).map(str::to_owned);
        // A fork's tables and columns have the golden's OIDs and numbers.
        let ids = names::ids(other.client(), &[&paired, &counted], &golden_key).await?;
        let golden_rows = |table: &str| rows.get(table).copied().unwrap_or(0) + 1;
        let before =
            read_bounded(other.client(), &paired, &golden_key, &snapshot.catalog, (&golden_rows, Read::Hash))
                .await?;
        let followed = names::follow(self.admin.client(), &paired, &ids).await?;
        let key_now = followed.keys_now(self.shape);
        // Twice the golden's rows and a thousand more at most: past that the
        // rows the candidate made would be what the daemon holds.
        let grown = |table: &str| {
            let golden = followed.golden_table(table).unwrap_or(table);
            rows.get(golden).copied().unwrap_or(0) * 2 + 1_000
        };
        let after = followed.values_back(
            read_bounded(self.admin.client(), &followed.now, &key_now, now, (&grown, Read::Hash)).await?,
        );
        // A table left out of either read (grown past the bound), or whose
        // rows its key no longer pairs (the key set through a view too), is
        // counted.
        let unpaired = |t: &&Target| match (before.get(&t.table), after.get(&t.table)) {
            (Some(b), Some(a)) => {
                b.rows.keys().filter(|k| a.rows.contains_key(*k)).count() * 2 < b.rows.len()
            }
            _ => true,
        };
        counted.extend(paired.iter().filter(unpaired).cloned());
        let mut lost_columns: BTreeMap<String, Target> = BTreeMap::new();
        for l in losses(&paired, &before, &after, rows)
            .into_iter()
            .filter(|l| super::overwrite::enough(l.lost.lost, l.rows))
        {
            let t = paired.iter().find(|t| t.table == l.table).expect("a loss is of a target");
            let entry = lost_columns
                .entry(l.table.clone())
                .or_insert_with(|| Target { columns: vec![], ..t.clone() });
            entry.columns.push(l.column);
        }
        // The text of what was lost, for the message.
        let lost: Vec<Target> = lost_columns.into_values().collect();
        let values_before = read(other.client(), &lost, &golden_key, &snapshot.catalog).await?;
        let followed = names::follow(self.admin.client(), &lost, &ids).await?;
        let key_now = followed.keys_now(self.shape);
        let values_after =
            followed.values_back(read(self.admin.client(), &followed.now, &key_now, now).await?);
        let mut found = losses(&lost, &values_before, &values_after, rows);
        // (Columns no statement names are told only past a hazard's bounds.)
        found.retain(|l| super::overwrite::enough(l.lost.lost, l.rows));
        let counts_before = counts::read(other.client(), &counted, &snapshot.catalog).await?;
        let followed = names::follow(self.admin.client(), &counted, &ids).await?;
        let counts_after = followed.counts_back(counts::read(self.admin.client(), &followed.now, now).await?);
        found.extend(
            counted_losses(&counted, &counts_before, &counts_after, rows)
                .into_iter()
                .filter(|l| super::overwrite::enough(l.lost.lost, l.rows)),
        );
        Ok((values_before, found))
    }
}
