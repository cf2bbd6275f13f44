//! Reshaping a build's data in its staging database, after the data is
//! restored and before its indexes, constraints and triggers are: a subset
//! cut along references, masking, and the leak check that proves masking
//! left no source value behind. Nothing of it is sealed until all three pass;
//! a failure removes the staging area whole.
//!
//! What masking leaves behind besides the tables (dead row versions, the
//! maps, statistics taken before, the write-ahead log) is scrubbed by the
//! build: tables rewritten here ([`run`]), statistics rewritten and the
//! log reset once the server is stopped ([`scrub_statistics`], and the
//! build's `reset_wal`).

//! Whatever reads or compares the application's values here (a cast to
//! text, an `=` of its types, a condition, a check) runs in the owner role's
//! session, never the admin's: the dump may define casts and operators for
//! its own types, and they must not run as a superuser. The admin only makes
//! and fills Airlock's own tables (maps of text), counts rows and rewrites tables.

pub mod keys;
pub mod leak;
pub mod mask;
pub mod needles;
pub mod redis;
pub mod subset;
pub mod tables;

use std::path::Path;

use airlock_core::dsn::{DATABASE, OWNER_ROLE};
use airlock_core::error::{Error, ErrorCode, Result};
use airlock_core::layout::InstanceDir;
use airlock_core::records::masking::{MaskingReport, Shape, SubsetReport};
use airlock_host::users::Identity;
use airlock_mask::Key;
use airlock_postgres::admin::Admin;

/// A build's reshaping: what to do, and the key masking draws with.
pub struct Shaping<'a> {
    /// Masking rules and subset.
    pub shape: &'a Shape,
    /// The golden's masking key (there when it masks).
    pub key: Option<&'a Key>,
}

/// What reshaping did.
#[derive(Debug, Clone, Default)]
pub struct Shaped {
    /// The masking and its leak check.
    pub masking: Option<MaskingReport>,
    /// The subset.
    pub subset: Option<SubsetReport>,
}

/// The staging server reshaping works on.
pub struct Staging<'a> {
    /// Its directory.
    pub dir: &'a InstanceDir,
    /// Its postmaster.
    pub postmaster: i32,
    /// Who logs in as the owner role.
    pub owner_os_user: Option<&'a Identity>,
}

impl Shaping<'_> {
    /// Cuts, masks and checks the staging database; `statements` are the
    /// dump's definitions (its keys are read from them).
    pub async fn run(&self, staging: &Staging<'_>, statements: &[String]) -> Result<Shaped> {
        let began = std::time::Instant::now();
        let admin = Admin::connect(staging.dir, DATABASE, staging.postmaster).await?;
        let owner =
            Admin::connect_owner(staging.dir, DATABASE, staging.postmaster, staging.owner_os_user).await?;
        let leaves = tables::read(admin.client()).await?;
        let mut keys = keys::Keys::from_statements(statements);
        let rules = self.shape.mask.clone().unwrap_or_default();
        keys.add(&rules.references)?;
        let plan = match &self.shape.mask {
            Some(rules) => mask::plan(rules, &leaves, &keys)?,
            None => mask::Plan::default(),
        };
        for column in &self.shape.allow_unmasked {
            let known = mask::three_parts(column).is_some_and(|[s, t, c]| {
                leaves.iter().any(|l| l.named == format!("{s}.{t}") && l.columns.iter().any(|x| x.name == c))
            });
            if !known {
                return Err(Error::new(
                    ErrorCode::MaskInvalid,
                    format!("--allow-unmasked {column} names no column of the source"),
                    "name it as `schema.table.column`, as the scan and the error that asked for it do",
                ));
            }
        }
        if self.shape.masks() {
            unruled(&owner, &leaves, &plan, &self.shape.allow_unmasked).await?;
        }
        admin
            .execute(&format!(
                "CREATE SCHEMA airlock_mask; GRANT USAGE ON SCHEMA airlock_mask TO {OWNER_ROLE};"
            ))
            .await?;
        let mut shaped = Shaped::default();
        if !self.shape.subset.is_empty() || self.shape.subset_percent.is_some() {
            if self.shape.subset.is_empty() {
                return Err(Error::new(
                    ErrorCode::MaskInvalid,
                    "--subset-percent was given without --subset",
                    "name the table to start from: --subset 'schema.table' (and a condition after a colon, if any)",
                ));
            }
            shaped.subset = Some(
                subset::cut(&self.shape.subset, self.shape.subset_percent, &leaves, &keys, &admin, &owner)
                    .await?,
            );
        }
        if let (true, Some(key)) = (self.shape.masks(), self.key) {
            let masked_at = std::time::Instant::now();
            let masked = |c: &keys::Columns| {
                plan.columns.iter().any(|p| leaves[p.leaf].named == c.table && c.columns.contains(&p.column))
            };
            // The rules file's references are no constraint of the server's:
            // they are counted before and after, and must not lose a row.
            let virtual_links: Vec<&keys::Link> =
                keys.links.iter().filter(|l| !l.declared && (masked(&l.from) || masked(&l.to))).collect();
            let mut before = Vec::new();
            for link in &virtual_links {
                before.push(orphans(&owner, &leaves, link).await?);
            }
            let mut columns = mask::apply(&plan, &leaves, &admin, &owner, key).await?;
            for (link, was) in virtual_links.iter().zip(before) {
                let now = orphans(&owner, &leaves, link).await?;
                if now > was {
                    return Err(Error::new(
                        ErrorCode::MaskInvalid,
                        format!(
                            "{} rows of {} lost the row of {} they reference once masked (the rules file's reference \
                             {}({}) -> {}({}))",
                            now - was,
                            link.from.table,
                            link.to.table,
                            link.from.table,
                            link.from.columns.join(", "),
                            link.to.table,
                            link.to.columns.join(", ")
                        ),
                        "give both ends the same rule, or one end only (the other follows it)",
                    ));
                }
            }
            let checked_at = std::time::Instant::now();
            tracing::info!(seconds = masked_at.elapsed().as_secs_f64(), "masked; checking for leaks");
            let elsewhere = leak::check(&plan, &leaves, &owner, &mut columns).await?;
            let leak_check_seconds = checked_at.elapsed().as_secs_f64();
            let passed = elsewhere.found.is_empty() && columns.iter().all(|c| c.leaks == 0);
            let report = MaskingReport {
                columns,
                elsewhere,
                allowed_unmasked: self.shape.allow_unmasked.clone(),
                unique_keys_checked: keys.unique.iter().filter(|u| masked(u)).count() as u64,
                references_checked: keys.links.iter().filter(|l| masked(&l.from) || masked(&l.to)).count()
                    as u64,
                passed,
                seconds: masked_at.elapsed().as_secs_f64(),
                leak_check_seconds,
            };
            if !passed {
                let mut places: Vec<String> = report
                    .columns
                    .iter()
                    .filter(|c| c.leaks > 0)
                    .map(|c| format!("{}: {} rows unmasked", c.column, c.leaks))
                    .collect();
                places.extend(report.elsewhere.found.iter().cloned());
                return Err(Error::new(
                    ErrorCode::MaskLeak,
                    format!("the leak check found source values of masked columns in the golden: {}", places.join("; ")),
                    "mask those columns too (a rule in the rules file), or for an sql rule make its expression change \
                     every value; nothing was built",
                ));
            }
            shaped.masking = Some(report);
        } else if self.shape.masks() {
            return Err(Error::internal("a masked build has no masking key"));
        }
        admin.execute("DROP SCHEMA airlock_mask CASCADE").await?;
        // Rewritten, so no page keeps a dead, unmasked or cut row version.
        let mut touched: Vec<usize> = plan.columns.iter().map(|p| p.leaf).collect();
        if let Some(s) = &shaped.subset {
            for (i, leaf) in leaves.iter().enumerate() {
                let cut = s.tables.iter().any(|t| t.table == leaf.named && t.kept_rows != t.source_rows);
                if cut {
                    touched.push(i);
                }
            }
        }
        touched.sort();
        touched.dedup();
        // By the admin: a table with no index yet runs no code of the
        // application's to be rewritten, and a VACUUM the owner role were
        // not let do would be skipped with a mere warning.
        for i in touched {
            admin.execute(&format!("VACUUM (FULL) {}", leaves[i].sql)).await.map_err(|e| {
                Error::postgres(format!("rewriting {} failed: {}", leaves[i].named, e.message))
            })?;
        }
        if let Some(m) = &mut shaped.masking {
            m.seconds = began.elapsed().as_secs_f64();
        }
        Ok(shaped)
    }
}

/// Rows of `link`'s referencing table whose reference finds no row.
async fn orphans(owner: &Admin, leaves: &[tables::Leaf], link: &keys::Link) -> Result<i64> {
    use airlock_postgres::cell::Cell;
    let parents: Vec<&str> =
        leaves.iter().filter(|l| l.named == link.to.table).map(|l| l.sql.as_str()).collect();
    let mut total = 0;
    for child in leaves.iter().filter(|l| l.named == link.from.table) {
        let sql =
            format!("SELECT count(*) FROM ONLY {} AS x WHERE {}", child.sql, link.finds_no_row(&parents));
        total += owner.client().query_one(&sql, &[]).await.map_err(tables::failed)?.cell::<i64>(0)?;
    }
    Ok(total)
}

/// Refuses a column the classifier calls personal that no rule masks (or a
/// JSON path of a masked column no path rule reaches) and that is not allowed unmasked.
async fn unruled(
    owner: &Admin,
    leaves: &[tables::Leaf],
    plan: &mask::Plan,
    allowed: &[String],
) -> Result<()> {
    let found = crate::golden::scan::findings(owner.client(), leaves, 200).await?;
    let mut missing = Vec::new();
    for f in found {
        if allowed.contains(&f.column) {
            continue;
        }
        let masked = plan.columns.iter().find(|p| p.named == f.column);
        match masked.map(|p| &plan.domains[p.domain].transformer) {
            None => missing.push(format!("{} ({}: {})", f.column, f.finding.class.label(), f.finding.reason)),
            Some(airlock_mask::Transformer::Json(rules)) => {
                for (path, class) in &f.finding.paths {
                    let parts: Vec<&str> = path.split('.').collect();
                    let covered = rules.iter().any(|(p, _)| {
                        p.len() == parts.len() && p.iter().zip(&parts).all(|(r, x)| mask::glob(r, x))
                    });
                    if !covered {
                        missing.push(format!("{} at path {path} ({})", f.column, class.label()));
                    }
                }
            }
            Some(_) => {}
        }
    }
    if missing.is_empty() {
        return Ok(());
    }
    let first = missing[0].split(' ').next().unwrap_or_default().to_owned();
    Err(Error::new(
        ErrorCode::MaskUnmasked,
        format!(
            "{} sensitive column{} no masking rule: {}",
            missing.len(),
            if missing.len() == 1 { " has" } else { "s have" },
            missing.join("; ")
        ),
        format!(
            "add a rule for each to the rules file (`airlock golden scan --from-url -` proposes them), or keep one as \
             it is with --allow-unmasked (--allow-unmasked {first})"
        ),
    ))
}

/// Rewrites the statistics tables, whose dead row versions may hold values
/// sampled before masking (most common values, histograms): run after the
/// build's last ANALYZE.
pub async fn scrub_statistics(admin: &Admin) -> Result<()> {
    admin.execute("VACUUM (FULL) pg_catalog.pg_statistic").await?;
    admin.execute("VACUUM (FULL) pg_catalog.pg_statistic_ext_data").await
}

/// Whether a data directory's `pg_wal` holds only what `pg_resetwal` wrote (for tests and checks).
pub fn wal_segments(pgdata: &Path) -> usize {
    std::fs::read_dir(pgdata.join("pg_wal"))
        .map(|d| d.flatten().filter(|e| e.file_name().len() == 24).count())
        .unwrap_or(0)
}
