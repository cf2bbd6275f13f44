//! What an import of a live database made of its source, as a golden's
//! manifest keeps it: the roles and extensions carried (and what was not), and
//! how faithful the golden is to its source (the fidelity report). The import
//! itself, and the comparison that fills the report, are the golden
//! service's; these are the records.

use serde::{Deserialize, Serialize};

/// How an import went and how faithful its golden is.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize, utoipa::ToSchema)]
pub struct Report {
    /// The source's `server_version`, when it was a live database.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub source_version: Option<String>,
    /// A note when the golden runs another PostgreSQL major than its source:
    /// forks, and migrations tested on them, run on the golden's.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub major_note: Option<String>,
    /// Whether the dump was kept from an earlier build that failed after it.
    pub resumed: bool,
    /// Seconds spent dumping (0 when resumed or from a dump file).
    pub dump_seconds: f64,
    /// Seconds spent restoring.
    pub restore_seconds: f64,
    /// The archive's size.
    pub bytes: u64,
    /// Parallel jobs used.
    pub jobs: usize,
    /// Tables in the golden, and their rows.
    pub tables: usize,
    /// Rows in the golden's tables.
    pub rows: i64,
    /// Tables whose row counts differ: `table: source -> golden`.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub row_differences: Vec<String>,
    /// Catalog differences from the source to the golden, one line each.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub catalog_differences: Vec<String>,
    /// Extensions whose version differs: `name: source -> golden`.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub extension_differences: Vec<String>,
    /// Roles, extensions and what was not carried.
    pub imported: Imported,
    /// What was asked to be left out.
    #[serde(default, skip_serializing_if = "Exclusions::is_empty")]
    pub excluded: Exclusions,
    /// Whether the source's catalog and rows were compared (a live source), or
    /// only what a dump file says.
    pub compared: bool,
    /// What masking did, and its leak check (a masked build).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub masking: Option<airlock_core::records::masking::MaskingReport>,
    /// What a subset kept, per table (a subsetted build).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub subset: Option<airlock_core::records::masking::SubsetReport>,
}

impl Report {
    /// Whether the golden differs from its source.
    pub fn differs(&self) -> bool {
        !(self.row_differences.is_empty()
            && self.catalog_differences.is_empty()
            && self.extension_differences.is_empty())
    }

    /// The differences, one per line, at most `max`.
    pub fn differences(&self, max: usize) -> String {
        let all: Vec<&String> = self
            .catalog_differences
            .iter()
            .chain(&self.row_differences)
            .chain(&self.extension_differences)
            .collect();
        let mut text = all.iter().take(max).map(|s| s.as_str()).collect::<Vec<_>>().join("; ");
        if all.len() > max {
            text.push_str(&format!("; and {} more", all.len() - max));
        }
        text
    }
}

/// What an import made of the source's global objects, for the fidelity report.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize, utoipa::ToSchema)]
pub struct Imported {
    /// Roles created (`NOLOGIN`), by name.
    pub roles: Vec<String>,
    /// `group <- member` memberships recreated among them.
    pub memberships: Vec<String>,
    /// What was not carried, and why (superuser attributes, predefined-role
    /// memberships, event triggers, subscriptions).
    pub not_carried: Vec<String>,
    /// Extensions installed, with the versions installed.
    pub extensions: Vec<Extension>,
    /// Extensions of the source left out, because they can reach outside a
    /// fork ([`airlock_postgres::extensions`]).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub left_out_extensions: Vec<String>,
    /// The tables (`schema.name`) the archive's table of contents lists.
    #[serde(skip)]
    pub listed_tables: Vec<String>,
}

/// An extension installed in the source.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, utoipa::ToSchema)]
pub struct Extension {
    /// Its name.
    pub name: String,
    /// Its version.
    pub version: String,
    /// The schema it lives in.
    pub schema: String,
}

/// What an import from a live database leaves out, as pg_dump's patterns
/// (`orders`, `app.audit_*`, `archive`).
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize, utoipa::ToSchema)]
pub struct Exclusions {
    /// `--exclude-table` patterns.
    #[serde(default)]
    pub tables: Vec<String>,
    /// `--exclude-schema` patterns.
    #[serde(default)]
    pub schemas: Vec<String>,
}

impl Exclusions {
    /// Whether nothing is left out.
    pub fn is_empty(&self) -> bool {
        self.tables.is_empty() && self.schemas.is_empty()
    }

    /// Whether every object of schema `schema` is left out.
    pub fn leaves_out_schema(&self, schema: &str) -> bool {
        self.schemas.iter().any(|p| glob(p, schema))
    }

    /// Whether the table (or other object) `schema.name` is left out.
    pub fn leaves_out(&self, qualified: &str) -> bool {
        let (schema, name) = crate::catalog::split_qualified(qualified);
        self.schemas.iter().any(|p| glob(p, &schema))
            || self.tables.iter().any(|p| match p.split_once('.') {
                Some((ps, pn)) => glob(ps, &schema) && glob(pn, &name),
                None => glob(p, &name),
            })
    }
}

/// pg_dump's pattern matching, for the patterns people write: `*` and `?`.
fn glob(pattern: &str, text: &str) -> bool {
    let (p, t): (Vec<char>, Vec<char>) = (pattern.chars().collect(), text.chars().collect());
    let (mut pi, mut ti, mut star, mut mark) = (0, 0, None, 0);
    while ti < t.len() {
        if pi < p.len() && (p[pi] == '?' || p[pi] == t[ti]) {
            pi += 1;
            ti += 1;
        } else if pi < p.len() && p[pi] == '*' {
            star = Some(pi);
            mark = ti;
            pi += 1;
        } else if let Some(s) = star {
            pi = s + 1;
            mark += 1;
            ti = mark;
        } else {
            return false;
        }
    }
    p[pi..].iter().all(|c| *c == '*')
}
