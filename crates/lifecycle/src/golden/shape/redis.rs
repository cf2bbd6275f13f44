//! The masking of a golden's Redis part: the rules file's `[[redis]]` rules,
//! with the golden's key, as the Redis engine asks for them.

use airlock_core::error::{Error, ErrorCode, Result};
use airlock_core::records::masking::RedisRule;
use airlock_mask::{ColumnType, Key, Output, Transformer};
use airlock_redis::masking::{Masked, ValueMask};

/// The Redis rules, checked, and the key.
pub struct RedisMasking {
    key: Key,
    rules: Vec<(String, Vec<String>, Transformer)>,
}

fn text() -> ColumnType {
    ColumnType::Text { max_chars: None, fold_case: false }
}

impl RedisMasking {
    /// Checks `[[redis]]` rules: a pattern, and a transformer that takes text.
    pub fn compile(rules: &[RedisRule], key: Key) -> Result<RedisMasking> {
        let mut out = Vec::new();
        for (i, r) in rules.iter().enumerate() {
            let invalid = |why: String| {
                Error::new(
                    ErrorCode::MaskInvalid,
                    format!("Redis rule {} ({}): {why}", i + 1, r.pattern),
                    "fix the [[redis]] rule in the rules file (docs/MASKING.md)",
                )
            };
            if r.pattern.is_empty() || r.fields.iter().any(String::is_empty) {
                return Err(invalid("a rule needs a key pattern, and fields need names".into()));
            }
            let t = Transformer::compile(&r.spec).map_err(invalid)?;
            if matches!(t, Transformer::Sql(_)) {
                return Err(invalid("an sql rule runs in PostgreSQL, not on Redis values".into()));
            }
            t.fits(&text(), true).map_err(invalid)?;
            out.push((r.pattern.clone(), r.fields.clone(), t));
        }
        Ok(RedisMasking { key, rules: out })
    }

    /// Whether there is anything to mask.
    pub fn is_empty(&self) -> bool {
        self.rules.is_empty()
    }
}

impl ValueMask for RedisMasking {
    fn rules(&self) -> Vec<(String, Vec<String>)> {
        self.rules.iter().map(|(p, f, _)| (p.clone(), f.clone())).collect()
    }

    fn mask(&self, rule: usize, value: &str) -> Masked {
        let t = &self.rules[rule].2;
        for salt in 0..3 {
            match t.apply(&self.key, value, salt, &text()) {
                Some(Output::Value(m)) if m == value && t.from_value() => continue,
                Some(Output::Value(m)) => return Masked::Replace(m),
                Some(Output::Null) => return Masked::Remove,
                Some(Output::Unchanged) | None => return Masked::Keep,
            }
        }
        Masked::Keep
    }

    fn describe(&self, rule: usize) -> String {
        let (pattern, fields, t) = &self.rules[rule];
        match fields.is_empty() {
            true => format!("{pattern}: {}", t.describe()),
            false => format!("{pattern} [{}]: {}", fields.join(", "), t.describe()),
        }
    }
}
