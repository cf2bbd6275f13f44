//! `airlock golden scan`: which columns of a source hold personal data, read
//! from its catalog and a bounded sample of each table, with the rules file
//! that would mask them. A masked build runs the same classifier on its
//! staging copy and refuses a column it finds that no rule covers.

use serde::{Deserialize, Serialize};

use crate::golden::shape::tables::{self, failed, Leaf};
use airlock_core::error::{Error, ErrorCode, Result};
use airlock_core::records::masking::Spec;
use airlock_mask::classify::{self, Finding};
use airlock_mask::ColumnType;
use airlock_postgres::catalog::quote_ident;

/// A scan of a live database.
#[derive(Debug, Clone, Default, Serialize, Deserialize, utoipa::ToSchema)]
pub struct ScanRequest {
    /// The database to scan (read in one read-only transaction).
    pub from_url: String,
    /// Rows sampled per table (default 200, at most 10000).
    #[serde(default)]
    #[schema(minimum = 1, maximum = 10000)]
    pub sample: Option<usize>,
}

/// What a scan found.
#[derive(Debug, Clone, Default, Serialize, Deserialize, utoipa::ToSchema)]
pub struct ScanReport {
    /// The columns that hold personal data, with the rule proposed for each.
    pub columns: Vec<ScannedColumn>,
    /// A rules file (TOML) with those rules, for `golden create --mask`.
    pub rules: String,
    /// Tables read.
    pub tables: usize,
    /// Rows sampled per table at most.
    pub sample: usize,
    /// Seconds the scan took.
    pub seconds: f64,
}

/// One column a scan found.
#[derive(Debug, Clone, Default, Serialize, Deserialize, utoipa::ToSchema)]
pub struct ScannedColumn {
    /// `schema.table.column`.
    pub column: String,
    /// Its type.
    pub type_name: String,
    /// What it holds (`email`, `card number`, `free text with personal data`...).
    pub class: String,
    /// Why the scan thinks so.
    pub reason: String,
    /// The rule proposed.
    pub proposed: Spec,
}

/// A column the classifier found: `schema.table.column`, its type, and the finding.
pub(crate) struct Found {
    pub column: String,
    pub type_name: String,
    pub finding: Finding,
}

/// Classifies every column of `leaves`, sampling at most `sample` rows of each table.
pub(crate) async fn findings(
    client: &tokio_postgres::Client,
    leaves: &[Leaf],
    sample: usize,
) -> Result<Vec<Found>> {
    let mut out: Vec<Found> = Vec::new();
    for leaf in leaves {
        let sampled: Vec<&tables::Column> = leaf
            .columns
            .iter()
            .filter(|c| matches!(c.ty, ColumnType::Text { .. } | ColumnType::Json | ColumnType::Inet))
            .collect();
        let mut values: Vec<Vec<String>> = vec![Vec::new(); sampled.len()];
        if !sampled.is_empty() {
            // A block sample reads a bounded share of a big table's pages.
            let percent = if leaf.estimate > 0.0 {
                (100.0 * (sample as f64) * 4.0 / leaf.estimate).clamp(0.01, 100.0)
            } else {
                100.0
            };
            let list = sampled
                .iter()
                .map(|c| format!("{}::text", quote_ident(&c.name)))
                .collect::<Vec<_>>()
                .join(", ");
            let sql =
                format!("SELECT {list} FROM ONLY {} TABLESAMPLE SYSTEM ({percent}) LIMIT {sample}", leaf.sql);
            for row in client.query(&sql, &[]).await.map_err(failed)? {
                for (i, v) in values.iter_mut().enumerate() {
                    if let Ok(Some(text)) = row.try_get::<_, Option<String>>(i) {
                        v.push(text);
                    }
                }
            }
        }
        let (_, table) = leaf.named.split_once('.').unwrap_or(("", &leaf.named));
        for column in &leaf.columns {
            let named = format!("{}.{}", leaf.named, column.name);
            if column.generated || out.iter().any(|f| f.column == named) {
                continue;
            }
            let sample = sampled
                .iter()
                .position(|c| c.name == column.name)
                .map(|i| values[i].as_slice())
                .unwrap_or(&[]);
            if let Some(finding) = classify::column(table, &column.name, &column.ty, sample) {
                out.push(Found { column: named, type_name: column.type_sql.clone(), finding });
            }
        }
    }
    Ok(out)
}

/// The rule proposed for a finding.
pub(crate) fn proposal(f: &Finding, ty: &ColumnType) -> Spec {
    if !f.paths.is_empty() {
        return classify::json_proposal(&f.paths);
    }
    let spec = f.class.proposal();
    // A date of birth stored as text, or a card number in a number column: what fits the type.
    match (spec.transform.as_str(), ty) {
        ("noise", ColumnType::Text { .. }) => Spec { transform: "redact".into(), ..Default::default() },
        ("partial" | "redact", ColumnType::Number) => {
            Spec { transform: "noise".into(), bound: Some(1000.0), ..Default::default() }
        }
        ("email" | "name" | "phone" | "address" | "partial" | "redact", ColumnType::Date) => {
            Spec { transform: "date_shift".into(), max_days: Some(30), ..Default::default() }
        }
        _ => spec,
    }
}

/// Scans a live database.
pub async fn scan(req: &ScanRequest) -> Result<ScanReport> {
    let began = std::time::Instant::now();
    let sample = req.sample.unwrap_or(200);
    if !(1..=10_000).contains(&sample) {
        return Err(Error::new(
            ErrorCode::InvalidRequest,
            format!("a sample of {sample} rows is out of range"),
            "give --sample between 1 and 10000",
        ));
    }
    let client = airlock_postgres::target::connect_to(&req.from_url, "source").await?;
    client
        .batch_execute("SET search_path = pg_catalog, pg_temp; SET statement_timeout = '120s'; BEGIN ISOLATION LEVEL REPEATABLE READ, READ ONLY")
        .await
        .map_err(|e| Error::new(ErrorCode::SourceFailed, format!("reading the source failed: {}", tables::without_values(&e)), "check that its user may read its catalogs"))?;
    let leaves = tables::read(&client).await.map_err(source_failed)?;
    let found = findings(&client, &leaves, sample).await.map_err(source_failed)?;
    let _ = client.batch_execute("ROLLBACK").await;
    let columns: Vec<ScannedColumn> = found
        .iter()
        .map(|f| ScannedColumn {
            column: f.column.clone(),
            type_name: f.type_name.clone(),
            class: f.finding.class.label().into(),
            reason: f.finding.reason.clone(),
            proposed: proposal(&f.finding, &ColumnType::parse(&f.type_name)),
        })
        .collect();
    let rules = rules_file(&columns, &airlock_core::dsn::redact(&req.from_url));
    Ok(ScanReport { columns, rules, tables: leaves.len(), sample, seconds: began.elapsed().as_secs_f64() })
}

fn source_failed(e: Error) -> Error {
    Error::new(
        ErrorCode::SourceFailed,
        e.message,
        "check that the source's user may read every table (SELECT) and its catalogs",
    )
}

/// A TOML string.
fn quoted(s: &str) -> String {
    let mut o = String::from("\"");
    for c in s.chars() {
        match c {
            '"' => o.push_str("\\\""),
            '\\' => o.push_str("\\\\"),
            '\n' => o.push_str("\\n"),
            c if c.is_control() => o.push_str(&format!("\\u{:04x}", c as u32)),
            c => o.push(c),
        }
    }
    o.push('"');
    o
}

/// A spec's fields as TOML `key = value` pairs.
fn fields(s: &Spec) -> Vec<String> {
    let mut f = vec![format!("transform = {}", quoted(&s.transform))];
    if let Some(n) = s.keep_last {
        f.push(format!("keep_last = {n}"));
    }
    if let Some(b) = s.bound {
        f.push(format!("bound = {b:?}"));
    }
    if let Some(d) = s.max_days {
        f.push(format!("max_days = {d}"));
    }
    if let Some(v) = &s.value {
        f.push(format!("value = {}", quoted(v)));
    }
    if let Some(e) = &s.expression {
        f.push(format!("expression = {}", quoted(e)));
    }
    f
}

/// The rules file a scan proposes.
pub fn rules_file(columns: &[ScannedColumn], source: &str) -> String {
    let mut out = format!(
        "# Masking rules proposed by `airlock golden scan` for {source}.\n\
         # Check each one; `docs/MASKING.md` lists the transformers.\n"
    );
    for c in columns {
        out.push_str(&format!(
            "\n# {} ({}): {}\n[[columns]]\ncolumn = {}\n",
            c.class,
            c.type_name,
            c.reason,
            quoted(&c.column)
        ));
        for f in fields(&c.proposed) {
            out.push_str(&f);
            out.push('\n');
        }
        if !c.proposed.paths.is_empty() {
            out.push_str("paths = [\n");
            for p in &c.proposed.paths {
                out.push_str(&format!(
                    "  {{ path = {}, {} }},\n",
                    quoted(&p.path),
                    fields(&p.spec).join(", ")
                ));
            }
            out.push_str("]\n");
        }
    }
    out
}
