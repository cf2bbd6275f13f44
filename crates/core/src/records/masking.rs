//! What a masked or subsetted golden is made by, and what its build proved:
//! the rules a build applies (kept for refresh), and the record its manifest
//! carries. The secret that keys the masking is never part of either.

use serde::{Deserialize, Serialize};

/// How a golden's source is reshaped before anything of it is sealed: masked
/// columns, columns left unmasked on purpose, and a subset.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize, utoipa::ToSchema)]
pub struct Shape {
    /// Masking rules (`--mask rules.toml`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub mask: Option<MaskRules>,
    /// Columns (`schema.table.column`) the scan calls sensitive that are kept
    /// as they are on purpose (`--allow-unmasked`).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub allow_unmasked: Vec<String>,
    /// The rows to start a subset from, `schema.table: SQL condition`
    /// (`--subset`); none means every row.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub subset: Vec<String>,
    /// The share of the starting rows to keep, 0 to 100 (`--subset-percent`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub subset_percent: Option<f64>,
}

impl Shape {
    /// Whether it changes anything at all.
    pub fn is_empty(&self) -> bool {
        self.mask.is_none() && self.subset.is_empty() && self.subset_percent.is_none()
    }

    /// Whether it masks (a rules file may hold only references, for a subset).
    pub fn masks(&self) -> bool {
        self.mask.as_ref().is_some_and(|m| !m.columns.is_empty() || !m.redis.is_empty())
    }
}

/// A rules file: which columns are masked how, and references the schema does not declare.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize, utoipa::ToSchema)]
#[serde(deny_unknown_fields)]
pub struct MaskRules {
    /// Column rules; the first that matches a column applies.
    #[serde(default)]
    pub columns: Vec<ColumnRule>,
    /// References the schema does not declare, followed by a subset and by masking alike.
    #[serde(default)]
    pub references: Vec<Reference>,
    /// Redis keys whose values are masked (string values, or fields of hashes).
    #[serde(default)]
    pub redis: Vec<RedisRule>,
}

/// One column rule.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, utoipa::ToSchema)]
pub struct ColumnRule {
    /// `schema.table.column`; each part may be `*` or hold `*` (`*.*.email`, `public.*.phone*`).
    pub column: String,
    /// The transformer and its parameters.
    #[serde(flatten)]
    pub spec: Spec,
}

/// A transformer and its parameters.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize, utoipa::ToSchema)]
pub struct Spec {
    /// `email`, `name`, `phone`, `address`, `ip`, `uuid`, `hash`, `partial`,
    /// `noise`, `date_shift`, `null`, `constant`, `redact`, `json` or `sql`.
    pub transform: String,
    /// `partial`: how many characters at the end are kept.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub keep_last: Option<u32>,
    /// `noise`: the largest change, in the column's unit (days for dates).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub bound: Option<f64>,
    /// `date_shift`: the largest shift in days (the whole column moves by one amount).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub max_days: Option<u32>,
    /// `constant`: the value every row gets.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub value: Option<String>,
    /// `sql`: an expression of `value` (the column's value), such as `lower(value)`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub expression: Option<String>,
    /// `json`: transformers for paths inside the document.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[schema(no_recursion)]
    pub paths: Vec<JsonPathRule>,
}

/// A transformer for one path inside a `json` or `jsonb` value.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, utoipa::ToSchema)]
pub struct JsonPathRule {
    /// Keys separated by dots; `*` is any key or array element (`address.street`, `contacts.*.email`).
    pub path: String,
    /// The transformer for the values found there.
    #[serde(flatten)]
    pub spec: Spec,
}

/// A reference the schema does not declare: `from` rows need `to` rows.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, utoipa::ToSchema)]
#[serde(deny_unknown_fields)]
pub struct Reference {
    /// The referencing columns, `schema.table(col, ...)`.
    pub from: String,
    /// The referenced columns, `schema.table(col, ...)`.
    pub to: String,
}

/// Masking of a Redis part: keys matching `pattern`, their string value or the named hash fields.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, utoipa::ToSchema)]
pub struct RedisRule {
    /// A key pattern as `SCAN MATCH` takes it (`user:*`).
    pub pattern: String,
    /// Hash fields to mask; none means the key's string value.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub fields: Vec<String>,
    /// The transformer.
    #[serde(flatten)]
    pub spec: Spec,
}

/// What a masked or subsetted golden's manifest says of it (the detail is in
/// its import report).
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize, utoipa::ToSchema)]
pub struct MaskingRecord {
    /// Masked columns and their transformers (`public.people.email: email`).
    pub columns: Vec<String>,
    /// Whether the leak check found no source value of a masked column in the golden.
    pub leak_check_passed: bool,
    /// The subset it was cut to, if it was (`public.customers: ..., 2%`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub subset: Option<String>,
    /// Masked Redis keys (`session:* [email]: email`).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub redis: Vec<String>,
    /// For a promoted golden: the golden whose masking its data carries.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub inherited_from: Option<String>,
}

/// The proof a masked build gives: per column, and anywhere in the golden.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize, utoipa::ToSchema)]
pub struct MaskingReport {
    /// Each masked column.
    pub columns: Vec<MaskedColumn>,
    /// Source values of masked columns looked for in every other column.
    pub elsewhere: LeakSearch,
    /// Columns the scan calls sensitive left unmasked on purpose (`--allow-unmasked`).
    #[serde(default)]
    pub allowed_unmasked: Vec<String>,
    /// Unique keys holding a masked column, each created (so checked) on the masked values.
    #[serde(default)]
    pub unique_keys_checked: u64,
    /// References with a masked column at either end, each created (so
    /// validated) on the masked values, or checked by the build when the rules
    /// file declared it.
    #[serde(default)]
    pub references_checked: u64,
    /// Whether no source value was found anywhere.
    pub passed: bool,
    /// Seconds spent masking and checking, all told.
    pub seconds: f64,
    /// Of those, seconds spent on the leak check.
    #[serde(default)]
    pub leak_check_seconds: f64,
}

/// One masked column in the report.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize, utoipa::ToSchema)]
pub struct MaskedColumn {
    /// `schema.table.column`.
    pub column: String,
    /// Its transformer, with parameters (`partial keep_last=4`).
    pub transform: String,
    /// Why it is masked: `rule` or `follows schema.table.column` (a reference to a masked column).
    pub because: String,
    /// Distinct source values it held.
    pub distinct_values: u64,
    /// Rows whose masked value collided with another's in a unique or referenced
    /// column and was drawn again.
    pub collisions_resolved: u64,
    /// Distinct values kept as they were, having nothing in them the
    /// transformer changes (`---` under `phone`, `infinity` under
    /// `date_shift`, a document without the rule's paths).
    #[serde(default)]
    pub kept: u64,
    /// How the leak check was done on it (`every value`).
    pub checked: String,
    /// Rows still holding a source value of this column (0 when the check passed).
    pub leaks: u64,
}

/// The search for masked columns' source values anywhere in the golden.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize, utoipa::ToSchema)]
pub struct LeakSearch {
    /// How many distinct source values were looked for (8 characters or more;
    /// not those of `noise` and `date_shift` columns).
    pub values: u64,
    /// Columns searched, every row (all but numbers, dates and times, and booleans).
    pub columns_searched: u64,
    /// Bytes of column values read and searched.
    pub bytes_searched: u64,
    /// Columns where one was found, whole or inside, with how many rows.
    pub found: Vec<String>,
}

/// What a subset kept, per table.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize, utoipa::ToSchema)]
pub struct SubsetReport {
    /// The starting rows, as asked.
    pub roots: Vec<String>,
    /// The share of them kept, if one was asked.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub percent: Option<f64>,
    /// Every table: rows in the source, rows kept, and why.
    pub tables: Vec<SubsetTable>,
    /// Foreign keys (declared and from the rules file) checked in the golden, all of them holding.
    pub references_checked: u64,
    /// Seconds spent cutting.
    pub seconds: f64,
}

/// One table of a subset.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize, utoipa::ToSchema)]
pub struct SubsetTable {
    /// `schema.table`.
    pub table: String,
    /// Rows before the cut.
    pub source_rows: i64,
    /// Rows kept.
    pub kept_rows: i64,
    /// Why they were kept: starting rows, children of kept rows, parents kept rows need, or whole.
    pub why: String,
}
