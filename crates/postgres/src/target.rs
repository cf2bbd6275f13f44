//! Connecting to a database outside Airlock (a `migrate promote` target), with
//! libpq's `sslmode` meanings over rustls.
//!
//! tokio-postgres knows only `disable`, `prefer` and `require`, and verifies
//! nothing itself, so the mode is read here: `disable` is plaintext; `prefer`
//! (the default) and `require` encrypt without checking the certificate, as libpq
//! does; `verify-ca` and `verify-full` check it against `sslrootcert`, or the
//! system's CA bundle, and the host name (`verify-ca` is checked as strictly as
//! `verify-full`). File options tokio-postgres does not know are taken out of the
//! string before it is parsed.

use std::sync::Arc;

use rustls::client::danger::{HandshakeSignatureValid, ServerCertVerified, ServerCertVerifier};
use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, ServerName, UnixTime};
use rustls::{DigitallySignedStruct, SignatureScheme};

use airlock_core::error::{Error, ErrorCode, Result};

/// Where Debian and Ubuntu keep the system's CA bundle.
const SYSTEM_ROOTS: &str = "/etc/ssl/certs/ca-certificates.crt";
/// Options libpq knows that tokio-postgres would refuse.
const FILE_OPTIONS: [&str; 4] = ["sslrootcert", "sslcert", "sslkey", "sslcrl"];

fn bad_dsn(message: String) -> Error {
    Error::new(
        ErrorCode::InvalidRequest,
        message,
        "give a postgresql:// URL or a key=value connection string",
    )
}

/// The DSN's options as (key, value) pairs, and the DSN without the file options,
/// with `sslmode` rewritten to one tokio-postgres knows.
fn split_options(dsn: &str) -> (Vec<(String, String)>, String) {
    let mut options = Vec::new();
    if let Some((base, query)) = dsn.split_once('?').filter(|_| dsn.contains("://")) {
        let mut kept = Vec::new();
        for (k, v) in form_urlencoded::parse(query.as_bytes()) {
            options.push((k.to_string(), v.to_string()));
            if FILE_OPTIONS.contains(&k.as_ref()) {
                continue;
            }
            let v = if k == "sslmode" { tokio_mode(&v).to_owned() } else { v.into_owned() };
            kept.push((k.into_owned(), v));
        }
        let query: String = form_urlencoded::Serializer::new(String::new()).extend_pairs(kept).finish();
        let rebuilt = if query.is_empty() { base.to_owned() } else { format!("{base}?{query}") };
        return (options, rebuilt);
    }
    if dsn.contains("://") {
        return (options, dsn.to_owned());
    }
    let mut kept = Vec::new();
    for pair in dsn.split_whitespace() {
        let Some((k, v)) = pair.split_once('=') else {
            kept.push(pair.to_owned());
            continue;
        };
        options.push((k.to_owned(), v.trim_matches('\'').to_owned()));
        if FILE_OPTIONS.contains(&k) {
            continue;
        }
        kept.push(if k == "sslmode" { format!("sslmode={}", tokio_mode(v)) } else { pair.to_owned() });
    }
    (options, kept.join(" "))
}

/// The options `dsn` carries (`sslmode`, `sslrootcert`…), as libpq reads them.
pub fn options(dsn: &str) -> Vec<(String, String)> {
    split_options(dsn).0
}

/// `dsn` without the file options tokio-postgres would refuse, and with
/// `sslmode` as tokio-postgres knows it: for reading its host, port, user
/// and database.
pub fn without_file_options(dsn: &str) -> String {
    split_options(dsn).1
}

fn tokio_mode(mode: &str) -> &str {
    match mode {
        "disable" | "allow" => "disable",
        "require" | "verify-ca" | "verify-full" => "require",
        _ => "prefer",
    }
}

/// Connects to `dsn`; the session's driver runs in its own task.
pub async fn connect(dsn: &str) -> Result<tokio_postgres::Client> {
    connect_to(dsn, "target").await
}

/// Connects to `dsn`, which errors call `what` (`target`, `source`).
pub async fn connect_to(dsn: &str, what: &str) -> Result<tokio_postgres::Client> {
    let (options, plain) = split_options(dsn);
    let get = |key: &str| options.iter().rev().find(|(k, _)| k == key).map(|(_, v)| v.as_str());
    let mode = get("sslmode").unwrap_or("prefer");
    let config: tokio_postgres::Config =
        plain.parse().map_err(|e| bad_dsn(format!("the {what} DSN cannot be read: {e}")))?;
    let refused = |e: tokio_postgres::Error| {
        Error::new(
            ErrorCode::SourceFailed,
            format!(
                "cannot connect to the {what} {}: {}",
                airlock_core::dsn::redact(dsn),
                crate::admin::describe(&e)
            ),
            "check the DSN, that the server is up and reachable, and its sslmode",
        )
    };
    let client = match mode {
        "disable" | "allow" => {
            let (client, connection) = config.connect(tokio_postgres::NoTls).await.map_err(refused)?;
            tokio::spawn(connection);
            client
        }
        _ => {
            let tls = client_config(mode, get("sslrootcert"))?;
            let (client, connection) =
                config.connect(tokio_postgres_rustls::MakeRustlsConnect::new(tls)).await.map_err(refused)?;
            tokio::spawn(connection);
            client
        }
    };
    Ok(client)
}

/// Where and how a DSN's TLS connection goes, for [`crate::tunnel`]: its
/// first TCP host, the rustls configuration of its `sslmode`, and the libpq
/// keyword string that reaches the same database through a unix socket.
pub struct TlsEndpoint {
    /// The server's host name or address.
    pub host: String,
    /// Its port.
    pub port: u16,
    /// Whether a server that refuses TLS is used in plaintext (`prefer`).
    pub plaintext_allowed: bool,
    /// The TLS configuration of the DSN's `sslmode`.
    pub config: Arc<rustls::ClientConfig>,
    /// The user, database and options, as `key='value'` pairs (no host, port or password).
    pub keywords: String,
}

/// The TLS endpoint of `dsn`, if it asks for TLS over TCP (`sslmode` other
/// than `disable`/`allow`, and a host that is not a socket directory).
pub fn tls_endpoint(dsn: &str) -> Result<Option<TlsEndpoint>> {
    let (options, plain) = split_options(dsn);
    let get = |key: &str| options.iter().rev().find(|(k, _)| k == key).map(|(_, v)| v.as_str());
    let mode = get("sslmode").unwrap_or("prefer");
    if matches!(mode, "disable" | "allow") {
        return Ok(None);
    }
    let config: tokio_postgres::Config =
        plain.parse().map_err(|e| bad_dsn(format!("the source DSN cannot be read: {e}")))?;
    let Some(tokio_postgres::config::Host::Tcp(host)) = config.get_hosts().first() else { return Ok(None) };
    let port = config.get_ports().first().copied().unwrap_or(5432);
    let quote = keyword_value;
    let mut keywords = Vec::new();
    if let Some(user) = config.get_user() {
        keywords.push(format!("user={}", quote(user)));
    }
    if let Some(db) = config.get_dbname() {
        keywords.push(format!("dbname={}", quote(db)));
    }
    if let Some(options) = config.get_options() {
        keywords.push(format!("options={}", quote(options)));
    }
    if let Some(name) = config.get_application_name() {
        keywords.push(format!("application_name={}", quote(name)));
    }
    Ok(Some(TlsEndpoint {
        host: host.clone(),
        port,
        plaintext_allowed: mode == "prefer",
        config: Arc::new(client_config(mode, get("sslrootcert"))?),
        keywords: keywords.join(" "),
    }))
}

/// `value` quoted for a libpq `key='value'` connection string.
pub fn keyword_value(value: &str) -> String {
    format!("'{}'", value.replace('\\', "\\\\").replace('\'', "\\'"))
}

/// `dsn` with its database replaced by `database`.
pub fn with_database(dsn: &str, database: &str) -> String {
    if let Some((scheme, rest)) = dsn.split_once("://") {
        let (before_query, query) = match rest.split_once('?') {
            Some((b, q)) => (b, Some(q)),
            None => (rest, None),
        };
        let authority = before_query.split_once('/').map_or(before_query, |(a, _)| a);
        let encoded: String = form_urlencoded::byte_serialize(database.as_bytes()).collect();
        let mut out = format!("{scheme}://{authority}/{}", encoded.replace('+', "%20"));
        if let Some(q) = query {
            out.push('?');
            out.push_str(q);
        }
        return out;
    }
    format!("{dsn} dbname={}", keyword_value(database))
}

/// Where a DSN leads and as whom: what opening a raw session needs.
pub struct Server {
    /// The TCP host.
    pub host: String,
    /// Its port.
    pub port: u16,
    /// The role.
    pub user: String,
    /// The database.
    pub database: String,
    /// The password.
    pub password: String,
    /// Its TLS, unless `sslmode` asks for none.
    pub tls: Option<TlsEndpoint>,
}

/// The server `dsn` names over TCP.
pub fn server(dsn: &str) -> Result<Server> {
    let config: tokio_postgres::Config =
        without_file_options(dsn).parse().map_err(|e| bad_dsn(format!("a DSN cannot be read: {e}")))?;
    let Some(tokio_postgres::config::Host::Tcp(host)) = config.get_hosts().first() else {
        return Err(bad_dsn("a DSN names no TCP host".into()));
    };
    let text = |b: Option<&[u8]>| b.map(|b| String::from_utf8_lossy(b).into_owned()).unwrap_or_default();
    Ok(Server {
        host: host.clone(),
        port: config.get_ports().first().copied().unwrap_or(5432),
        user: config.get_user().unwrap_or_default().to_owned(),
        database: config.get_dbname().unwrap_or_default().to_owned(),
        password: text(config.get_password()),
        tls: tls_endpoint(dsn)?,
    })
}

fn provider() -> Arc<rustls::crypto::CryptoProvider> {
    Arc::new(rustls::crypto::ring::default_provider())
}

/// The rustls configuration for `mode`: verifying against `root_file` (or the
/// system bundle) for the verify modes, not verifying otherwise.
pub fn client_config(mode: &str, root_file: Option<&str>) -> Result<rustls::ClientConfig> {
    let builder = rustls::ClientConfig::builder_with_provider(provider())
        .with_safe_default_protocol_versions()
        .map_err(|e| Error::internal(format!("TLS: {e}")))?;
    if !mode.starts_with("verify") {
        return Ok(builder
            .dangerous()
            .with_custom_certificate_verifier(Arc::new(Unverified(provider())))
            .with_no_client_auth());
    }
    let path = root_file.unwrap_or(SYSTEM_ROOTS);
    let mut roots = rustls::RootCertStore::empty();
    let certs = CertificateDer::pem_file_iter(path).map_err(|e| {
        Error::new(
            ErrorCode::FileUnreadable,
            format!("cannot read the CA certificates {path}: {e}"),
            "give sslrootcert=FILE in the target DSN, or install the system's CA bundle",
        )
    })?;
    for cert in certs.flatten() {
        let _ = roots.add(cert);
    }
    Ok(builder.with_root_certificates(roots).with_no_client_auth())
}

/// `sslmode=require`/`prefer`: encrypted, the certificate not checked (as libpq).
#[derive(Debug)]
struct Unverified(Arc<rustls::crypto::CryptoProvider>);

impl ServerCertVerifier for Unverified {
    fn verify_server_cert(
        &self,
        _end_entity: &CertificateDer<'_>,
        _intermediates: &[CertificateDer<'_>],
        _server_name: &ServerName<'_>,
        _ocsp_response: &[u8],
        _now: UnixTime,
    ) -> std::result::Result<ServerCertVerified, rustls::Error> {
        Ok(ServerCertVerified::assertion())
    }

    fn verify_tls12_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> std::result::Result<HandshakeSignatureValid, rustls::Error> {
        rustls::crypto::verify_tls12_signature(message, cert, dss, &self.0.signature_verification_algorithms)
    }

    fn verify_tls13_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> std::result::Result<HandshakeSignatureValid, rustls::Error> {
        rustls::crypto::verify_tls13_signature(message, cert, dss, &self.0.signature_verification_algorithms)
    }

    fn supported_verify_schemes(&self) -> Vec<SignatureScheme> {
        self.0.signature_verification_algorithms.supported_schemes()
    }
}

#[cfg(test)]
mod tests {
    #[test]
    fn a_dsns_database_is_replaced_and_nothing_else() {
        assert_eq!(
            super::with_database(
                "postgresql://ops:pw@db:6432/prod?sslmode=verify-full&sslrootcert=/c.crt",
                "post gres"
            ),
            "postgresql://ops:pw@db:6432/post%20gres?sslmode=verify-full&sslrootcert=/c.crt"
        );
        assert_eq!(super::with_database("postgresql://ops@db", "x"), "postgresql://ops@db/x");
        assert_eq!(super::with_database("host=db dbname=prod", "o'x"), "host=db dbname=prod dbname='o\\'x'");
    }

    use super::*;

    #[test]
    fn file_options_are_taken_out_and_modes_mapped() {
        let (opts, dsn) =
            split_options("postgresql://u:p@h:5/db?sslmode=verify-full&sslrootcert=%2Ftmp%2Fca.crt");
        assert_eq!(dsn, "postgresql://u:p@h:5/db?sslmode=require");
        assert!(opts.contains(&("sslrootcert".into(), "/tmp/ca.crt".into())));
        let (_, dsn) = split_options("host=h sslmode=verify-ca sslrootcert=/x dbname=d");
        assert_eq!(dsn, "host=h sslmode=require dbname=d");
        let (_, dsn) = split_options("postgresql://u@h/db");
        assert_eq!(dsn, "postgresql://u@h/db");
    }
}
