//! Transformers: a rule's [`Spec`] checked once ([`Transformer::compile`],
//! [`Transformer::fits`]), then applied to each distinct source value.

use airlock_core::records::masking::Spec;

use crate::key::{Draw, Key};
use crate::{fake, json_path};

/// What a column holds, read from PostgreSQL's name of its type (`format_type`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ColumnType {
    /// `text`, `character varying(n)`, `character(n)`, `citext`, `name`.
    Text {
        /// The longest value it takes, when limited.
        max_chars: Option<usize>,
        /// `citext`: values equal but for case are the same value.
        fold_case: bool,
    },
    /// Integers, `numeric`, `real`, `double precision`.
    Number,
    /// `date`, `timestamp`, `timestamp with time zone`.
    Date,
    /// `json`, `jsonb`.
    Json,
    /// `uuid`.
    Uuid,
    /// `inet`, `cidr`.
    Inet,
    /// Anything else, by its name.
    Other(String),
}

impl ColumnType {
    /// Reads `format_type`'s output.
    pub fn parse(name: &str) -> ColumnType {
        let base = name.split('(').next().unwrap_or(name).trim();
        let limit =
            || name.split_once('(').and_then(|(_, rest)| rest.trim_end_matches(')').parse::<usize>().ok());
        match base {
            "text" | "name" => ColumnType::Text { max_chars: None, fold_case: false },
            "character varying" | "character" => ColumnType::Text { max_chars: limit(), fold_case: false },
            "citext" => ColumnType::Text { max_chars: None, fold_case: true },
            "smallint" | "integer" | "bigint" | "numeric" | "real" | "double precision" => ColumnType::Number,
            "date" | "timestamp without time zone" | "timestamp with time zone" => ColumnType::Date,
            "json" | "jsonb" => ColumnType::Json,
            "uuid" => ColumnType::Uuid,
            "inet" => ColumnType::Inet,
            _ if base.ends_with("citext") => ColumnType::Text { max_chars: None, fold_case: true },
            _ => ColumnType::Other(name.to_owned()),
        }
    }

    fn is_text(&self) -> bool {
        matches!(self, ColumnType::Text { .. })
    }
}

/// A masked value.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Output {
    /// The value, as text the column's type reads.
    Value(String),
    /// SQL NULL.
    Null,
    /// Left as it was, because nothing in it is the source's to hide (a JSON
    /// document without the rule's paths, `infinity`, `NaN`).
    Unchanged,
}

/// A checked transformer.
#[derive(Debug, Clone, PartialEq)]
pub enum Transformer {
    /// A fake email address at a reserved domain.
    Email,
    /// A fake person's name, as many words as the source's.
    Name,
    /// The digits drawn again, punctuation kept.
    Phone,
    /// A fake street address.
    Address,
    /// A private-range IP address.
    Ip,
    /// A UUID.
    Uuid,
    /// Hex digits of the keyed digest.
    Hash,
    /// All but the last characters replaced by `X`, separators kept.
    Partial {
        /// Characters kept at the end.
        keep_last: usize,
    },
    /// The value moved by at most `bound` (days for dates), never by nothing.
    Noise {
        /// The largest change.
        bound: f64,
    },
    /// Every date of the column moved by one amount, at most `max_days`.
    DateShift {
        /// The largest shift.
        max_days: u32,
    },
    /// NULL.
    Null,
    /// One value for every row.
    Constant(String),
    /// The text `[redacted]`.
    Redact,
    /// Transformers for paths inside a JSON document.
    Json(Vec<(Vec<String>, Transformer)>),
    /// An expression of `value`, run by the server.
    Sql(String),
}

impl Transformer {
    /// Checks a rule's transformer and parameters.
    pub fn compile(spec: &Spec) -> Result<Transformer, String> {
        let unused = |allowed: &[&str]| -> Result<(), String> {
            let given = [
                ("keep_last", spec.keep_last.is_some()),
                ("bound", spec.bound.is_some()),
                ("max_days", spec.max_days.is_some()),
                ("value", spec.value.is_some()),
                ("expression", spec.expression.is_some()),
                ("paths", !spec.paths.is_empty()),
            ];
            match given.iter().find(|(name, set)| *set && !allowed.contains(name)) {
                Some((name, _)) => Err(format!("transform {:?} takes no {name}", spec.transform)),
                None => Ok(()),
            }
        };
        let t = match spec.transform.as_str() {
            "email" => Transformer::Email,
            "name" => Transformer::Name,
            "phone" => Transformer::Phone,
            "address" => Transformer::Address,
            "ip" => Transformer::Ip,
            "uuid" => Transformer::Uuid,
            "hash" => Transformer::Hash,
            "null" => Transformer::Null,
            "redact" => Transformer::Redact,
            "partial" => {
                unused(&["keep_last"])?;
                let keep_last = spec.keep_last.ok_or("transform \"partial\" needs keep_last (say keep_last = 4)")?;
                return Ok(Transformer::Partial { keep_last: keep_last as usize });
            }
            "noise" => {
                unused(&["bound"])?;
                let bound = spec.bound.ok_or("transform \"noise\" needs bound (say bound = 10)")?;
                if !(bound.is_finite() && bound > 0.0) {
                    return Err(format!("noise bound {bound} is not a number above 0"));
                }
                return Ok(Transformer::Noise { bound });
            }
            "date_shift" => {
                unused(&["max_days"])?;
                let max_days = spec.max_days.ok_or("transform \"date_shift\" needs max_days (say max_days = 30)")?;
                if max_days == 0 {
                    return Err("date_shift max_days must be at least 1".into());
                }
                return Ok(Transformer::DateShift { max_days });
            }
            "constant" => {
                unused(&["value"])?;
                let value = spec.value.clone().ok_or("transform \"constant\" needs value (say value = \"n/a\")")?;
                return Ok(Transformer::Constant(value));
            }
            "sql" => {
                unused(&["expression"])?;
                let e = spec.expression.clone().ok_or("transform \"sql\" needs expression (say expression = \"lower(value)\")")?;
                if e.contains(';') || e.contains("--") || e.contains("/*") || e.trim().is_empty() {
                    return Err(format!("expression {e:?} is not one SQL expression (no `;` or comments)"));
                }
                return Ok(Transformer::Sql(e));
            }
            "json" => {
                unused(&["paths"])?;
                if spec.paths.is_empty() {
                    return Err("transform \"json\" needs paths (say paths = [{ path = \"address.street\", transform = \"address\" }])".into());
                }
                let mut rules = Vec::new();
                for p in &spec.paths {
                    let inner = Transformer::compile(&p.spec)?;
                    if matches!(inner, Transformer::Json(_) | Transformer::Sql(_)) {
                        return Err(format!("path {:?} takes a value transformer, not {:?}", p.path, p.spec.transform));
                    }
                    let parts: Vec<String> = p.path.split('.').map(str::to_owned).collect();
                    if parts.iter().any(String::is_empty) {
                        return Err(format!("path {:?} has an empty key", p.path));
                    }
                    rules.push((parts, inner));
                }
                return Ok(Transformer::Json(rules));
            }
            other => {
                return Err(format!(
                    "{other:?} is not a transformer: use email, name, phone, address, ip, uuid, hash, partial, noise, \
                     date_shift, null, constant, redact, json or sql"
                ))
            }
        };
        unused(&[])?;
        Ok(t)
    }

    /// The transformer as the report and the manifest name it (`partial keep_last=4`).
    pub fn describe(&self) -> String {
        match self {
            Transformer::Email => "email".into(),
            Transformer::Name => "name".into(),
            Transformer::Phone => "phone".into(),
            Transformer::Address => "address".into(),
            Transformer::Ip => "ip".into(),
            Transformer::Uuid => "uuid".into(),
            Transformer::Hash => "hash".into(),
            Transformer::Partial { keep_last } => format!("partial keep_last={keep_last}"),
            Transformer::Noise { bound } => format!("noise bound={bound}"),
            Transformer::DateShift { max_days } => format!("date_shift max_days={max_days}"),
            Transformer::Null => "null".into(),
            Transformer::Constant(v) => format!("constant {v:?}"),
            Transformer::Redact => "redact".into(),
            Transformer::Json(rules) => format!(
                "json {}",
                rules
                    .iter()
                    .map(|(p, t)| format!("{}: {}", p.join("."), t.describe()))
                    .collect::<Vec<_>>()
                    .join(", ")
            ),
            Transformer::Sql(e) => format!("sql {e}"),
        }
    }

    /// Whether distinct values can be kept distinct (a collision is drawn
    /// again): what a unique or referenced column needs.
    pub fn keeps_distinct(&self) -> bool {
        matches!(
            self,
            Transformer::Email
                | Transformer::Name
                | Transformer::Phone
                | Transformer::Address
                | Transformer::Ip
                | Transformer::Uuid
                | Transformer::Hash
                | Transformer::DateShift { .. }
                | Transformer::Sql(_)
        )
    }

    /// Whether its output depends on the source value (and so must differ from it).
    pub fn from_value(&self) -> bool {
        !matches!(self, Transformer::Null | Transformer::Constant(_) | Transformer::Redact)
    }

    /// The values inside a source value this transformer replaces, when they
    /// are not the whole value: a `json` rule's values at its paths.
    pub fn inner_values(&self, value: &str) -> Vec<String> {
        match self {
            Transformer::Json(rules) => {
                let paths: Vec<&[String]> = rules.iter().map(|(p, _)| p.as_slice()).collect();
                json_path::values_at(value, &paths)
            }
            _ => Vec::new(),
        }
    }

    /// Why it cannot apply to a column of type `ty` that is `nullable` or not.
    pub fn fits(&self, ty: &ColumnType, nullable: bool) -> Result<(), String> {
        let ok = match self {
            Transformer::Email
            | Transformer::Name
            | Transformer::Phone
            | Transformer::Address
            | Transformer::Hash
            | Transformer::Partial { .. }
            | Transformer::Redact => ty.is_text(),
            Transformer::Ip => ty.is_text() || *ty == ColumnType::Inet,
            Transformer::Uuid => ty.is_text() || *ty == ColumnType::Uuid,
            Transformer::Noise { .. } => matches!(ty, ColumnType::Number | ColumnType::Date),
            Transformer::DateShift { .. } => *ty == ColumnType::Date,
            Transformer::Json(_) => *ty == ColumnType::Json,
            Transformer::Null => {
                if !nullable {
                    return Err(
                        "the column is NOT NULL, so `null` cannot apply: use redact, constant or a fake"
                            .into(),
                    );
                }
                true
            }
            Transformer::Constant(_) | Transformer::Sql(_) => true,
        };
        if ok {
            return Ok(());
        }
        let takes = match self {
            Transformer::Ip => "text or inet",
            Transformer::Uuid => "text or uuid",
            Transformer::Noise { .. } => "numbers and dates",
            Transformer::DateShift { .. } => "dates and timestamps",
            Transformer::Json(_) => "json and jsonb",
            _ => "text (text, varchar, char, citext)",
        };
        Err(format!("{} takes {takes}, and the column is {}", self.describe(), type_name(ty)))
    }

    /// The masked value of `value` in a column of type `ty`, the `salt`th draw
    /// (0 first). `None` for an `sql` transformer, which the server computes.
    pub fn apply(&self, key: &Key, value: &str, salt: u32, ty: &ColumnType) -> Option<Output> {
        let tag = self.describe();
        let folded;
        let seen = match ty {
            ColumnType::Text { fold_case: true, .. } => {
                folded = value.to_lowercase();
                folded.as_str()
            }
            _ => value,
        };
        let mut d = Draw::new(key.digest(&tag, seen, salt));
        let out = match self {
            Transformer::Email => fake::email(&mut d, value),
            Transformer::Name => {
                let n = fake::name(&mut d, value);
                // A small list runs out: past eight draws a number makes it unique.
                if salt >= 8 {
                    format!("{n} {}", salt - 6)
                } else {
                    n
                }
            }
            Transformer::Phone => fake::phone(&mut d, value),
            Transformer::Address => fake::address(&mut d, value),
            Transformer::Ip => fake::ip(&mut d, value),
            Transformer::Uuid => fake::uuid(&mut d, value),
            Transformer::Hash => d.hex(20),
            Transformer::Partial { keep_last } => partial(value, *keep_last),
            Transformer::Noise { bound } => match noise(&mut d, value, *bound, ty) {
                Some(v) => v,
                None => return Some(Output::Unchanged),
            },
            Transformer::DateShift { max_days } => {
                // One shift for the whole column: keyed by the transformer alone.
                let mut whole = Draw::new(key.digest(&tag, "", 0));
                let days = 1 + whole.below(*max_days as u64) as i64;
                let days = if whole.below(2) == 0 { days } else { -days };
                match shift_date(value, days) {
                    Some(v) => v,
                    None => return Some(Output::Unchanged),
                }
            }
            Transformer::Null => return Some(Output::Null),
            Transformer::Constant(v) => v.clone(),
            Transformer::Redact => "[redacted]".into(),
            Transformer::Json(rules) => {
                let paths: Vec<&[String]> = rules.iter().map(|(p, _)| p.as_slice()).collect();
                let rewritten = json_path::rewrite(value, &paths, &mut |i, leaf, number| {
                    let ty = match number {
                        true => ColumnType::Number,
                        false => ColumnType::Text { max_chars: None, fold_case: false },
                    };
                    match rules[i].1.apply(key, leaf, salt, &ty) {
                        Some(Output::Value(v)) => json_path::Leaf::Text(v),
                        Some(Output::Null) => json_path::Leaf::Null,
                        Some(Output::Unchanged) | None => json_path::Leaf::Keep,
                    }
                });
                return Some(rewritten.map_or(Output::Unchanged, Output::Value));
            }
            Transformer::Sql(_) => return None,
        };
        Some(Output::Value(match ty {
            ColumnType::Text { max_chars: Some(n), .. } => out.chars().take(*n).collect(),
            _ => out,
        }))
    }
}

fn type_name(ty: &ColumnType) -> String {
    match ty {
        ColumnType::Text { .. } => "text".into(),
        ColumnType::Number => "a number".into(),
        ColumnType::Date => "a date".into(),
        ColumnType::Json => "json".into(),
        ColumnType::Uuid => "uuid".into(),
        ColumnType::Inet => "inet".into(),
        ColumnType::Other(name) => name.clone(),
    }
}

/// Letters and digits but the last `keep` replaced by `X`; a value no longer
/// than `keep` is replaced whole (keeping it would keep the value).
fn partial(value: &str, keep: usize) -> String {
    let chars: Vec<char> = value.chars().collect();
    let alnum = chars.iter().filter(|c| c.is_alphanumeric()).count();
    let keep = if alnum <= keep { 0 } else { keep };
    let mut seen = 0;
    chars
        .iter()
        .map(|c| {
            if !c.is_alphanumeric() {
                return *c;
            }
            seen += 1;
            if seen > alnum - keep {
                *c
            } else {
                'X'
            }
        })
        .collect()
}

/// A nonzero change of at most `bound`, keeping integers whole and decimals to their places.
fn noise(d: &mut Draw, value: &str, bound: f64, ty: &ColumnType) -> Option<String> {
    let step = |d: &mut Draw, b: i128| -> i128 {
        let b = b.max(1);
        let n = 1 + d.below(b as u64) as i128;
        if d.below(2) == 0 {
            n
        } else {
            -n
        }
    };
    if *ty == ColumnType::Date {
        return shift_date(value, step(d, bound as i128) as i64);
    }
    let v = value.trim();
    let (int_part, frac) = v.split_once('.').unwrap_or((v, ""));
    let plain = |s: &str| !s.is_empty() && s.trim_start_matches('-').chars().all(|c| c.is_ascii_digit());
    if plain(int_part) && (frac.is_empty() || frac.chars().all(|c| c.is_ascii_digit())) {
        let scale = frac.len() as u32;
        let scaled: i128 = format!("{int_part}{frac}").parse().ok()?;
        let moved = scaled + step(d, (bound * 10f64.powi(scale as i32)) as i128);
        let sign = if moved < 0 { "-" } else { "" };
        let digits = moved.unsigned_abs().to_string();
        if scale == 0 {
            return Some(format!("{sign}{digits}"));
        }
        let digits = format!("{digits:0>width$}", width = scale as usize + 1);
        let (i, f) = digits.split_at(digits.len() - scale as usize);
        return Some(format!("{sign}{i}.{f}"));
    }
    let f: f64 = v.parse().ok().filter(|f: &f64| f.is_finite())?;
    let r = d.below(1_000_000) as f64 / 1_000_000.0;
    let delta = bound * (0.001 + 0.999 * r);
    Some(format!("{}", if d.below(2) == 0 { f + delta } else { f - delta }))
}

/// `YYYY-MM-DD` and whatever follows it (a time, a zone), the date moved by `days`.
fn shift_date(value: &str, days: i64) -> Option<String> {
    let v = value.trim();
    if v.ends_with(" BC") {
        return None;
    }
    let (year, rest) = v.split_once('-')?;
    let (month, rest) = rest.split_once('-')?;
    let day = rest.get(..2)?;
    let tail = &rest[2..];
    let (y, m, d): (i64, i64, i64) = (year.parse().ok()?, month.parse().ok()?, day.parse().ok()?);
    let (y, m, d) = civil_from_days(days_from_civil(y, m, d) + days);
    if y < 1 {
        return None;
    }
    Some(format!("{y:04}-{m:02}-{d:02}{tail}"))
}

/// Days since 1970-01-01 of a proleptic Gregorian date.
fn days_from_civil(y: i64, m: i64, d: i64) -> i64 {
    let y = if m <= 2 { y - 1 } else { y };
    let era = y.div_euclid(400);
    let yoe = y - era * 400;
    let doy = (153 * (m + if m > 2 { -3 } else { 9 }) + 2) / 5 + d - 1;
    let doe = yoe * 365 + yoe / 4 - yoe / 100 + doy;
    era * 146097 + doe - 719468
}

/// The date `z` days after 1970-01-01.
fn civil_from_days(z: i64) -> (i64, i64, i64) {
    let z = z + 719468;
    let era = z.div_euclid(146097);
    let doe = z - era * 146097;
    let yoe = (doe - doe / 1460 + doe / 36524 - doe / 146096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let d = doy - (153 * mp + 2) / 5 + 1;
    let m = if mp < 10 { mp + 3 } else { mp - 9 };
    (yoe + era * 400 + if m <= 2 { 1 } else { 0 }, m, d)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn spec(t: &str) -> Spec {
        Spec { transform: t.into(), ..Default::default() }
    }

    fn text() -> ColumnType {
        ColumnType::Text { max_chars: None, fold_case: false }
    }

    #[test]
    fn the_same_value_masks_alike_and_another_key_otherwise() {
        let (k1, k2) = (Key::random(), Key::random());
        let t = Transformer::compile(&spec("email")).unwrap();
        let a = t.apply(&k1, "jane@corp.io", 0, &text());
        assert_eq!(a, t.apply(&k1, "jane@corp.io", 0, &text()));
        assert_ne!(a, t.apply(&k2, "jane@corp.io", 0, &text()));
        assert_ne!(a, t.apply(&k1, "jane@corp.io", 1, &text()), "a second draw differs");
        let ci = ColumnType::Text { max_chars: None, fold_case: true };
        assert_eq!(t.apply(&k1, "Jane@Corp.io", 0, &ci), t.apply(&k1, "jane@corp.io", 0, &ci));
    }

    #[test]
    fn parameters_are_checked_and_types_fit() {
        assert!(Transformer::compile(&spec("partial")).unwrap_err().contains("keep_last"));
        assert!(Transformer::compile(&spec("shuffle")).unwrap_err().contains("not a transformer"));
        let mut s = spec("email");
        s.keep_last = Some(2);
        assert!(Transformer::compile(&s).unwrap_err().contains("takes no keep_last"));
        assert!(Transformer::Email.fits(&ColumnType::Number, true).is_err());
        assert!(Transformer::Null.fits(&text(), false).unwrap_err().contains("NOT NULL"));
        assert!(Transformer::Noise { bound: 3.0 }.fits(&ColumnType::parse("numeric(10,2)"), true).is_ok());
        assert_eq!(
            ColumnType::parse("character varying(12)"),
            ColumnType::Text { max_chars: Some(12), fold_case: false }
        );
        let mut sql = spec("sql");
        sql.expression = Some("1; DROP TABLE x".into());
        assert!(Transformer::compile(&sql).is_err());
    }

    #[test]
    fn partial_noise_and_shifts_keep_shape() {
        assert_eq!(partial("4111-1111-1111-1234", 4), "XXXX-XXXX-XXXX-1234");
        assert_eq!(partial("123", 4), "XXX", "a value no longer than what is kept goes whole");
        let k = Key::random();
        let n = Transformer::Noise { bound: 5.0 };
        for v in ["100", "12.50", "-3", "0.07"] {
            let Some(Output::Value(out)) = n.apply(&k, v, 0, &ColumnType::Number) else { panic!() };
            let (a, b): (f64, f64) = (v.parse().unwrap(), out.parse().unwrap());
            assert!(a != b && (a - b).abs() <= 5.0, "{v} -> {out}");
            assert_eq!(v.contains('.'), out.contains('.'), "{v} -> {out}");
            if let Some((_, f)) = v.split_once('.') {
                assert_eq!(out.split_once('.').unwrap().1.len(), f.len());
            }
        }
        assert_eq!(shift_date("2024-02-28 10:00:00+00", 2).unwrap(), "2024-03-01 10:00:00+00");
        assert_eq!(shift_date("2024-01-01", -1).unwrap(), "2023-12-31");
        assert_eq!(shift_date("infinity", 3), None);
        let s = Transformer::DateShift { max_days: 30 };
        let d = ColumnType::Date;
        let (Some(Output::Value(a)), Some(Output::Value(b))) =
            (s.apply(&k, "2024-05-01", 0, &d), s.apply(&k, "2024-05-11", 0, &d))
        else {
            panic!()
        };
        let days = |t: &str| {
            days_from_civil(t[..4].parse().unwrap(), t[5..7].parse().unwrap(), t[8..10].parse().unwrap())
        };
        assert_eq!(days(&b) - days(&a), 10, "one shift for the whole column keeps intervals");
        assert_ne!(a, "2024-05-01");
    }

    #[test]
    fn json_rules_mask_inside_documents() {
        let k = Key::random();
        let t = Transformer::Json(vec![
            (vec!["address".into(), "street".into()], Transformer::Address),
            (vec!["contacts".into(), "*".into(), "email".into()], Transformer::Email),
        ]);
        let doc = r#"{"address":{"street":"1 High St","city":"Leeds"},"contacts":[{"email":"a@b.io"}]}"#;
        let Some(Output::Value(out)) = t.apply(&k, doc, 0, &ColumnType::Json) else { panic!() };
        assert!(!out.contains("High St") && !out.contains("a@b.io") && out.contains("Leeds"), "{out}");
        assert_eq!(t.apply(&k, r#"{"x":1}"#, 0, &ColumnType::Json), Some(Output::Unchanged));
        assert_eq!(t.inner_values(doc), vec!["1 High St", "a@b.io"]);
    }

    #[test]
    fn limits_and_name_suffixes_hold() {
        let k = Key::random();
        let short = ColumnType::Text { max_chars: Some(10), fold_case: false };
        let Some(Output::Value(e)) = Transformer::Email.apply(&k, "a@b.c", 0, &short) else { panic!() };
        assert!(e.chars().count() <= 10);
        let Some(Output::Value(n)) = Transformer::Name.apply(&k, "Jo Ma", 9, &text()) else { panic!() };
        assert!(n.ends_with(" 3"), "{n}");
    }
}
