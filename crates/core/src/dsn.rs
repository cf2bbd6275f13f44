//! Connection strings: building a sandbox's, and keeping passwords out of sight.

use std::path::Path;

/// The database every golden and sandbox serves.
pub const DATABASE: &str = "app";
/// The role handed to agents: owns nothing itself, inherits the owner role, never a superuser.
pub const AGENT_ROLE: &str = "airlock_agent";
/// The non-superuser role that owns everything loaded into a golden.
pub const OWNER_ROLE: &str = "airlock_owner";
/// The bootstrap superuser; reachable only by peer authentication from the daemon's OS user.
pub const ADMIN_ROLE: &str = "airlock_admin";
/// The port number in every instance's socket name (instances listen on no TCP port).
pub const SOCKET_PORT: u16 = 5432;

/// The DSN an agent uses: the agent role, its password, the private socket directory.
pub fn sandbox(socket_dir: &Path, password: &str) -> String {
    format!(
        "postgresql://{AGENT_ROLE}:{password}@/{DATABASE}?host={}&port={SOCKET_PORT}",
        socket_dir.display()
    )
}

/// The same DSN with any password removed, for logs, events, manifests and errors.
///
/// Handles both URL (`postgresql://user:pw@host/db?password=pw`) and key/value
/// (`host=h password='p w'`) forms.
pub fn redact(dsn: &str) -> String {
    let trimmed = dsn.trim();
    if let Some(rest) = trimmed.strip_prefix("postgresql://").or_else(|| trimmed.strip_prefix("postgres://"))
    {
        let scheme = &trimmed[..trimmed.len() - rest.len()];
        let (authority, tail) = match rest.find(['/', '?']) {
            Some(i) => rest.split_at(i),
            None => (rest, ""),
        };
        let authority = match authority.rsplit_once('@') {
            Some((userinfo, host)) => {
                let user = userinfo.split(':').next().unwrap_or("");
                format!("{user}@{host}")
            }
            None => authority.to_owned(),
        };
        let tail = match tail.split_once('?') {
            Some((path, query)) => {
                // Keys are compared as libpq reads them: percent-decoded (a
                // `%70assword=` is a password all the same).
                let kept: Vec<&str> = query
                    .split('&')
                    .filter(|kv| !is_secret_key(&percent_decode(kv.split('=').next().unwrap_or(""))))
                    .collect();
                if kept.is_empty() {
                    path.to_owned()
                } else {
                    format!("{path}?{}", kept.join("&"))
                }
            }
            None => tail.to_owned(),
        };
        return format!("{scheme}{authority}{tail}");
    }
    redact_key_value(trimmed)
}

fn redact_key_value(dsn: &str) -> String {
    let mut out = Vec::new();
    let mut chars = dsn.chars().peekable();
    while chars.peek().is_some() {
        while chars.peek().is_some_and(|c| c.is_whitespace()) {
            chars.next();
        }
        let mut key = String::new();
        while let Some(&c) = chars.peek() {
            if c == '=' || c.is_whitespace() {
                break;
            }
            key.push(c);
            chars.next();
        }
        while chars.peek().is_some_and(|c| c.is_whitespace()) {
            chars.next();
        }
        let mut value = String::new();
        if chars.peek() == Some(&'=') {
            chars.next();
            while chars.peek().is_some_and(|c| c.is_whitespace()) {
                chars.next();
            }
            if chars.peek() == Some(&'\'') {
                value.push(chars.next().unwrap());
                while let Some(c) = chars.next() {
                    value.push(c);
                    if c == '\\' {
                        if let Some(n) = chars.next() {
                            value.push(n);
                        }
                    } else if c == '\'' {
                        break;
                    }
                }
            } else {
                while let Some(&c) = chars.peek() {
                    if c.is_whitespace() {
                        break;
                    }
                    value.push(c);
                    chars.next();
                }
            }
        }
        if !key.is_empty() && !is_secret_key(&key) {
            out.push(format!("{key}={value}"));
        }
    }
    out.join(" ")
}

/// Writes a libpq password file (mode 0600, created new) that gives `password` to
/// any server, so a client tool gets it through `PGPASSFILE` rather than its
/// command line or environment.
pub fn write_passfile(path: &Path, password: &str) -> std::io::Result<()> {
    use std::io::Write;
    use std::os::unix::fs::OpenOptionsExt;
    let mut f = std::fs::OpenOptions::new().create_new(true).write(true).mode(0o600).open(path)?;
    let escaped = password.replace('\\', "\\\\").replace(':', "\\:");
    writeln!(f, "*:*:*:*:{escaped}")
}

/// The password inside a DSN, if it has one. URLs are read by hand, since libpq
/// options such as `sslrootcert` are unknown to tokio-postgres's parser.
pub fn password(dsn: &str) -> Option<String> {
    let trimmed = dsn.trim();
    let Some(rest) = trimmed.strip_prefix("postgresql://").or_else(|| trimmed.strip_prefix("postgres://"))
    else {
        let config: tokio_postgres::Config = trimmed.parse().ok()?;
        return config.get_password().map(|p| String::from_utf8_lossy(p).into_owned());
    };
    let (authority, tail) = match rest.find(['/', '?']) {
        Some(i) => rest.split_at(i),
        None => (rest, ""),
    };
    let from_query = tail.split_once('?').and_then(|(_, query)| {
        form_urlencoded::parse(query.as_bytes()).find(|(k, _)| k == "password").map(|(_, v)| v.into_owned())
    });
    let from_userinfo = authority
        .rsplit_once('@')
        .and_then(|(userinfo, _)| userinfo.split_once(':'))
        .map(|(_, pw)| percent_decode(pw));
    from_query.or(from_userinfo)
}

/// Whether a connection parameter carries a secret: the password, or the
/// passphrase of a client key.
fn is_secret_key(key: &str) -> bool {
    let key = key.trim();
    key.eq_ignore_ascii_case("password") || key.eq_ignore_ascii_case("sslpassword")
}

fn percent_decode(s: &str) -> String {
    let bytes = s.as_bytes();
    let mut out = Vec::with_capacity(bytes.len());
    let mut i = 0;
    while i < bytes.len() {
        let hex = bytes.get(i + 1..i + 3).and_then(|h| std::str::from_utf8(h).ok());
        match (bytes[i], hex.and_then(|h| u8::from_str_radix(h, 16).ok())) {
            (b'%', Some(b)) => {
                out.push(b);
                i += 3;
            }
            (c, _) => {
                out.push(c);
                i += 1;
            }
        }
    }
    String::from_utf8_lossy(&out).into_owned()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn redacts_url_passwords() {
        assert_eq!(
            redact("postgresql://bob:s3cret@db.example:5432/shop"),
            "postgresql://bob@db.example:5432/shop"
        );
        assert_eq!(
            redact("postgres://bob:s3cret@h/shop?sslmode=require&password=x"),
            "postgres://bob@h/shop?sslmode=require"
        );
        assert_eq!(redact("postgresql://h/shop"), "postgresql://h/shop");
        // libpq decodes keys: an encoded `password` or `sslpassword` is one.
        assert_eq!(
            redact("postgresql://u@h/db?sslmode=require&%70assword=pw&%73slpassword=k&p%61ssword=x"),
            "postgresql://u@h/db?sslmode=require"
        );
        assert_eq!(
            redact("postgresql://a:b@/app?host=/tmp/x&port=5432"),
            "postgresql://a@/app?host=/tmp/x&port=5432"
        );
    }

    #[test]
    fn redacts_key_value_passwords() {
        assert_eq!(redact("host=h password=s3cret dbname=shop"), "host=h dbname=shop");
        assert_eq!(redact("host=h sslpassword=k dbname=shop"), "host=h dbname=shop");
        assert_eq!(redact("host=h password = 'a b\\' c' user=u"), "host=h user=u");
    }

    #[test]
    fn finds_passwords() {
        assert_eq!(password("postgresql://bob:s3cret@h/shop").as_deref(), Some("s3cret"));
        assert_eq!(password("host=h password=pw dbname=x").as_deref(), Some("pw"));
        assert_eq!(password("postgresql://bob@h/shop"), None);
        assert_eq!(
            password("postgresql://bob:a%40b@h:7432/sb-1?sslmode=verify-full&sslrootcert=/x/ca.crt")
                .as_deref(),
            Some("a@b")
        );
        assert_eq!(password("postgresql://bob@h/shop?password=q%20r").as_deref(), Some("q r"));
        let dsn = sandbox(Path::new("/x/run"), "abc");
        assert_eq!(password(&dsn).as_deref(), Some("abc"));
        assert!(!redact(&dsn).contains("abc"));
    }
}
