//! Checks of user input (names, labels, TTLs), each failing with a code and a hint.

use std::collections::BTreeMap;
use std::time::Duration;

use crate::error::{Error, ErrorCode, Result};

/// Checks a golden or sandbox name: 1–48 of `a-z 0-9 _ -`, starting with a letter.
pub fn name(kind: &str, value: &str) -> Result<()> {
    let ok = !value.is_empty()
        && value.len() <= 48
        && value.starts_with(|c: char| c.is_ascii_lowercase())
        && value.chars().all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == '_' || c == '-');
    if ok {
        Ok(())
    } else {
        Err(Error::new(
            ErrorCode::InvalidName,
            format!("invalid {kind} name {value:?}"),
            "use 1 to 48 characters of a-z, 0-9, '_' and '-', starting with a letter",
        ))
    }
}

/// Checks a sandbox name: a name (see [`name`]) that cannot be taken for an
/// id, since ids and names are looked up alike (a name like a deleted
/// sandbox's id would otherwise catch what was meant for it).
pub fn sandbox_name(value: &str) -> Result<()> {
    name("sandbox", value)?;
    if value.starts_with("sb-") {
        return Err(Error::new(
            ErrorCode::InvalidName,
            format!("invalid sandbox name {value:?}: names beginning with \"sb-\" are taken for ids"),
            "pick a name that does not begin with sb-",
        ));
    }
    Ok(())
}

/// Parses `key=value` labels into a map; keys are `[A-Za-z0-9_./-]{1,63}`, values up to 255 printable characters.
pub fn labels<S: AsRef<str>>(items: &[S]) -> Result<BTreeMap<String, String>> {
    let mut out = BTreeMap::new();
    for item in items {
        let item = item.as_ref();
        let bad = || {
            Error::new(
                ErrorCode::InvalidLabel,
                format!("malformed label {item:?}"),
                "write labels as key=value; keys use A-Z a-z 0-9 _ . / - (at most 63), values at most 255 printable characters",
            )
        };
        let (k, v) = item.split_once('=').ok_or_else(bad)?;
        label(k, v).map_err(|e| if k == RESERVED_LABEL_KEY { e } else { bad() })?;
        out.insert(k.to_owned(), v.to_owned());
    }
    Ok(out)
}

/// The label key Airlock keeps for its own sandboxes (a migration test's forks
/// carry `airlock=migration-test`, and a restart deletes them by it).
pub const RESERVED_LABEL_KEY: &str = "airlock";

/// Checks one label key and value.
pub fn label(key: &str, value: &str) -> Result<()> {
    if key == RESERVED_LABEL_KEY {
        return Err(Error::new(
            ErrorCode::InvalidLabel,
            format!("the label key {key:?} is reserved for Airlock's own sandboxes"),
            "choose another key, such as app/airlock",
        ));
    }
    let key_ok = !key.is_empty()
        && key.len() <= 63
        && key.chars().all(|c| c.is_ascii_alphanumeric() || "_./-".contains(c));
    let value_ok = value.len() <= 255 && !value.chars().any(char::is_control);
    if key_ok && value_ok {
        Ok(())
    } else {
        Err(Error::new(
            ErrorCode::InvalidLabel,
            format!("malformed label {key:?}={value:?}"),
            "keys use A-Z a-z 0-9 _ . / - (at most 63), values at most 255 printable characters",
        ))
    }
}

/// Parses a human TTL such as `15m`, `90s` or `1h30m`.
pub fn parse_ttl(text: &str) -> Result<Duration> {
    let bad = |why: &str| {
        Error::new(
            ErrorCode::InvalidTtl,
            format!("invalid TTL {text:?}: {why}"),
            "give a positive duration such as 90s, 15m or 2h",
        )
    };
    let text = text.trim();
    if text.starts_with('-') {
        return Err(bad("it is negative"));
    }
    let d = humantime::parse_duration(text).map_err(|e| bad(&e.to_string()))?;
    if d.is_zero() {
        return Err(bad("it is zero"));
    }
    Ok(d)
}

/// Parses a non-negative duration such as `0`, `500ms`, `30s` or `5m` given for `what`.
pub fn duration(what: &str, text: &str) -> Result<Duration> {
    let text = text.trim();
    if text == "0" {
        return Ok(Duration::ZERO);
    }
    humantime::parse_duration(text).map_err(|e| {
        Error::new(
            ErrorCode::InvalidRequest,
            format!("invalid {what} {text:?}: {e}"),
            "give a duration such as 0, 500ms, 30s or 5m",
        )
    })
}

/// Checks a TTL in seconds against the configured maximum.
pub fn ttl_seconds(seconds: i64, max: Duration) -> Result<Duration> {
    if seconds <= 0 {
        return Err(Error::new(
            ErrorCode::InvalidTtl,
            format!("TTL must be positive, got {seconds} seconds"),
            "give a positive duration such as 90s, 15m or 2h",
        ));
    }
    let d = Duration::from_secs(seconds as u64);
    if d > max {
        return Err(Error::new(
            ErrorCode::InvalidTtl,
            format!(
                "TTL of {} is over the maximum of {}",
                humantime::format_duration(d),
                humantime::format_duration(max)
            ),
            "ask for a shorter TTL, or start the daemon with a larger --max-ttl",
        ));
    }
    Ok(d)
}

/// Parses a size such as `4MB`, `64kB`, `20G`, `1GiB` or `1073741824` (bytes).
pub fn bytes(text: &str) -> Result<u64> {
    let bad = || {
        Error::new(
            ErrorCode::InvalidRequest,
            format!("invalid size {text:?}"),
            "write a size such as 64kB, 4MB or 20G",
        )
    };
    let t = text.trim();
    let (digits, unit) = t.split_at(t.find(|c: char| !c.is_ascii_digit()).unwrap_or(t.len()));
    let n: u64 = digits.parse().map_err(|_| bad())?;
    let unit = unit.trim().to_ascii_uppercase();
    let mult: u64 = match unit.trim_end_matches("IB").trim_end_matches('B') {
        "" => 1,
        "K" => 1 << 10,
        "M" => 1 << 20,
        "G" => 1 << 30,
        "T" => 1 << 40,
        _ => return Err(bad()),
    };
    n.checked_mul(mult).ok_or_else(bad)
}

/// A share of a volume to keep free: a size (`2G`) or a percentage (`10%`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Reserve {
    /// This many bytes.
    Bytes(u64),
    /// This percentage of the volume's size.
    Percent(u8),
}

impl Reserve {
    /// Parses `2G`, `500M` or `10%` (0 to 50 percent).
    pub fn parse(text: &str) -> Result<Reserve> {
        match text.trim().strip_suffix('%') {
            Some(p) => match p.trim().parse::<u8>() {
                Ok(p) if p <= 50 => Ok(Reserve::Percent(p)),
                _ => Err(Error::new(
                    ErrorCode::InvalidRequest,
                    format!("invalid reserve {text:?}"),
                    "give a percentage from 0% to 50%, or a size such as 2G",
                )),
            },
            None => bytes(text).map(Reserve::Bytes),
        }
    }

    /// The bytes to keep free on a volume of `size` bytes.
    pub fn of(self, size: u64) -> u64 {
        match self {
            Reserve::Bytes(b) => b,
            Reserve::Percent(p) => size / 100 * p as u64,
        }
    }
}

/// The host of `HOST:PORT` (an IPv6 address without its brackets); None if
/// `addr` is not one.
pub fn host_of(addr: &str) -> Option<&str> {
    let (host, port) = addr.rsplit_once(':')?;
    port.parse::<u16>().ok()?;
    let host = host.strip_prefix('[').and_then(|h| h.strip_suffix(']')).unwrap_or(host);
    (!host.is_empty()).then_some(host)
}

#[cfg(test)]
mod tests {
    #[test]
    fn an_address_has_its_host_without_brackets() {
        use super::host_of;
        assert_eq!(host_of("[fd00::1]:7441"), Some("fd00::1"));
        assert_eq!(host_of("node-b.internal:7441"), Some("node-b.internal"));
        assert_eq!(host_of("10.0.0.2:7440"), Some("10.0.0.2"));
        for bad in ["10.0.0.2", ":7440", "host:port", "host:70000"] {
            assert_eq!(host_of(bad), None, "{bad}");
        }
    }

    use super::*;

    #[test]
    fn sandbox_names_cannot_look_like_ids() {
        assert!(sandbox_name("task-1").is_ok());
        assert_eq!(sandbox_name("sb-wta924hz4y").unwrap_err().code, ErrorCode::InvalidName);
        assert!(sandbox_name("sbx").is_ok());
    }

    #[test]
    fn reserves_are_sizes_or_shares() {
        assert_eq!(Reserve::parse("10%").unwrap().of(1000 << 20), 100 << 20);
        assert_eq!(Reserve::parse("2G").unwrap(), Reserve::Bytes(2 << 30));
        assert!(Reserve::parse("80%").is_err());
        assert!(Reserve::parse("lots").is_err());
    }

    #[test]
    fn names() {
        assert!(name("golden", "shop").is_ok());
        assert!(name("golden", "shop_2-b").is_ok());
        for bad in ["", "Shop", "1shop", "shop!", "a/b", &"x".repeat(49)] {
            assert_eq!(name("golden", bad).unwrap_err().code, ErrorCode::InvalidName, "{bad}");
        }
    }

    #[test]
    fn labels_parse_and_reject() {
        let m = labels(&["team=evals", "run.id=42", "empty="]).unwrap();
        assert_eq!(m["team"], "evals");
        assert_eq!(m["empty"], "");
        for bad in ["novalue", "=x", "sp ace=x", "k=\u{7}"] {
            assert_eq!(labels(&[bad]).unwrap_err().code, ErrorCode::InvalidLabel, "{bad}");
        }
    }

    #[test]
    fn sizes() {
        assert_eq!(bytes("20G").unwrap(), 20 << 30);
        assert_eq!(bytes("4MB").unwrap(), 4 << 20);
        assert_eq!(bytes("64kB").unwrap(), 64 << 10);
        assert_eq!(bytes("1GiB").unwrap(), 1 << 30);
        assert_eq!(bytes("512").unwrap(), 512);
        assert!(bytes("big").is_err());
        assert!(bytes("5Q").is_err());
    }

    #[test]
    fn ttls() {
        assert_eq!(parse_ttl("15m").unwrap(), Duration::from_secs(900));
        assert_eq!(parse_ttl("1h30m").unwrap(), Duration::from_secs(5400));
        for bad in ["0s", "-5m", "soon", ""] {
            assert_eq!(parse_ttl(bad).unwrap_err().code, ErrorCode::InvalidTtl, "{bad}");
        }
        let max = Duration::from_secs(3600);
        assert!(ttl_seconds(60, max).is_ok());
        assert_eq!(ttl_seconds(0, max).unwrap_err().code, ErrorCode::InvalidTtl);
        assert_eq!(ttl_seconds(-1, max).unwrap_err().code, ErrorCode::InvalidTtl);
        assert_eq!(ttl_seconds(3601, max).unwrap_err().code, ErrorCode::InvalidTtl);
    }
}
