//! `airlock golden`: create, refresh, promote, prune, remove and pools.

use std::io::Read;
use std::path::PathBuf;

use hyper::Method;

use super::output;
use super::{Cli, GoldenCommand, Placement};
use airlock_core::error::{Error, ErrorCode, Result};
use airlock_core::validate;
use airlock_lifecycle::golden::{CreateGolden, Golden};
use airlock_lifecycle::sandbox::BranchRequest;
use airlock_listen::client::{encode, NO_BODY};

/// A source's DSN from its flag: `-` reads stdin; one given on the command
/// line with a password gets a warning (it shows in `ps`).
fn source_dsn(value: &str) -> Result<String> {
    if value == "-" {
        let mut text = String::new();
        std::io::stdin().read_to_string(&mut text)?;
        return Ok(text.trim().to_owned());
    }
    let from_env = std::env::var("AIRLOCK_FROM_URL").ok().as_deref() == Some(value);
    if !from_env && airlock_core::dsn::password(value).is_some() {
        eprintln!(
            "warning: a password on the command line is visible to `ps` while this runs; \
             use `--from-url -` (DSN on stdin) or AIRLOCK_FROM_URL instead"
        );
    }
    Ok(value.to_owned())
}

/// A masking rules file, read and parsed here: the daemon gets its rules.
fn rules_file(path: &std::path::Path) -> Result<airlock_core::records::masking::MaskRules> {
    let text = std::fs::read_to_string(path).map_err(|e| {
        Error::new(
            ErrorCode::FileUnreadable,
            format!("cannot read {}: {e}", path.display()),
            "check the path",
        )
    })?;
    toml::from_str(&text).map_err(|e| {
        Error::new(
            ErrorCode::MaskInvalid,
            format!("{} is not a masking rules file: {}", path.display(), e.to_string().trim()),
            "write [[columns]] tables with `column` and `transform` (docs/MASKING.md); `airlock golden scan` proposes a file",
        )
    })
}

pub(super) fn absolute(paths: &[PathBuf]) -> Result<Vec<PathBuf>> {
    paths
        .iter()
        .map(|p| {
            std::fs::canonicalize(p).map_err(|e| {
                Error::new(
                    ErrorCode::FileUnreadable,
                    format!("cannot read {}: {e}", p.display()),
                    "check the path",
                )
            })
        })
        .collect()
}

/// Waits for `request` (a golden build), showing the build's progress on
/// `spinner` as the daemon reports it.
pub(super) async fn with_progress<T>(
    client: &airlock_listen::client::Client,
    name: &str,
    spinner: &indicatif::ProgressBar,
    request: impl std::future::Future<Output = Result<T>>,
) -> Result<T> {
    let path = format!("/v1/goldens/{}/progress", encode(name));
    let poll = async {
        loop {
            tokio::time::sleep(std::time::Duration::from_millis(400)).await;
            let progress: Result<airlock_lifecycle::golden::progress::BuildProgress> =
                client.call(Method::GET, &path, NO_BODY).await;
            if let Ok(p) = progress {
                spinner.set_message(output::build_progress(name, &p));
            }
        }
    };
    tokio::pin!(request);
    tokio::select! {
        done = &mut request => done,
        _ = poll => unreachable!("polling never ends"),
    }
}

pub(super) async fn golden(cli: &Cli, cmd: &GoldenCommand) -> Result<i32> {
    let json = cli.json;
    let client = cli.client()?;
    match cmd {
        GoldenCommand::Create {
            name,
            schema,
            seed,
            from_url,
            from_dump,
            exclude_table,
            exclude_schema,
            allow_extension,
            jobs,
            pool,
            postgres,
            redis_seed,
            redis_rdb,
            redis_from_url,
            mask,
            allow_unmasked,
            subset,
            subset_percent,
        } => {
            validate::name("golden", name)?;
            let one = |p: &PathBuf| absolute(std::slice::from_ref(p)).map(|mut v| v.remove(0));
            let redis_url = match redis_from_url.as_deref() {
                Some("-") if from_url.as_deref() == Some("-") => return Err(Error::new(
                    ErrorCode::InvalidRequest,
                    "--from-url - and --redis-from-url - both read stdin",
                    "pass one of them in its environment variable (AIRLOCK_FROM_URL, AIRLOCK_REDIS_FROM_URL)",
                )),
                Some("-") => {
                    let mut text = String::new();
                    std::io::stdin().read_to_string(&mut text)?;
                    Some(text.trim().to_owned())
                }
                Some(url) => {
                    let from_env = std::env::var("AIRLOCK_REDIS_FROM_URL").ok().as_deref() == Some(url);
                    if !from_env && airlock_core::records::redis::redact(url) != url {
                        eprintln!(
                            "warning: a password on the command line is visible to `ps` while this runs; \
                             use `--redis-from-url -` (URL on stdin) or AIRLOCK_REDIS_FROM_URL instead"
                        );
                    }
                    Some(url.to_owned())
                }
                None => None,
            };
            let redis = match (redis_seed, redis_rdb, redis_url) {
                (Some(path), _, _) => {
                    Some(airlock_core::records::redis::RedisSource::Seed { path: one(path)? })
                }
                (_, Some(path), _) => {
                    Some(airlock_core::records::redis::RedisSource::Rdb { path: one(path)? })
                }
                (_, _, Some(url)) => Some(airlock_core::records::redis::RedisSource::Url { url }),
                _ => None,
            };
            let from_url = from_url.as_deref().map(source_dsn).transpose()?;
            let mask = mask.as_deref().map(rules_file).transpose()?;
            let req = CreateGolden {
                name: name.clone(),
                schema: absolute(schema)?,
                seed: absolute(seed)?,
                from_url,
                from_dump: from_dump
                    .as_ref()
                    .map(|p| absolute(std::slice::from_ref(p)))
                    .transpose()?
                    .map(|mut v| v.remove(0)),
                exclude: airlock_lifecycle::golden::Exclusions {
                    tables: exclude_table.clone(),
                    schemas: exclude_schema.clone(),
                },
                jobs: *jobs,
                pool_size: *pool,
                postgres: *postgres,
                redis,
                allow_extensions: allow_extension.clone(),
                mask,
                allow_unmasked: allow_unmasked.clone(),
                subset: subset.clone(),
                subset_percent: *subset_percent,
            };
            req.source()?;
            let spinner = output::spinner(json, format!("building golden {name}"));
            let g: Result<Golden> =
                with_progress(&client, name, &spinner, client.call(Method::POST, "/v1/goldens", Some(&req)))
                    .await;
            spinner.finish_and_clear();
            let g = g?;
            output::print(json, &g, || output::golden(&g));
            Ok(0)
        }
        GoldenCommand::Scan { from_url, sample, out } => {
            let req = airlock_lifecycle::golden::scan::ScanRequest {
                from_url: source_dsn(from_url)?,
                sample: Some(*sample),
            };
            let spinner = output::spinner(json, "scanning the source".to_string());
            let report: Result<airlock_lifecycle::golden::scan::ScanReport> =
                client.call(Method::POST, "/v1/scans", Some(&req)).await;
            spinner.finish_and_clear();
            let report = report?;
            if let Some(path) = out {
                std::fs::write(path, &report.rules).map_err(|e| {
                    Error::new(
                        ErrorCode::FileUnreadable,
                        format!("cannot write {}: {e}", path.display()),
                        "check the path",
                    )
                })?;
            }
            output::print(json, &report, || output::scan(&report, out.is_some()));
            Ok(0)
        }
        GoldenCommand::Refresh { name } => {
            let spinner = output::spinner(json, format!("building a new generation of {name}"));
            let path = format!("/v1/goldens/{}/refresh", encode(name));
            let g: Result<Golden> =
                with_progress(&client, name, &spinner, client.call(Method::POST, &path, NO_BODY)).await;
            spinner.finish_and_clear();
            let g = g?;
            output::print(json, &g, || output::golden(&g));
            Ok(0)
        }
        GoldenCommand::Replicate { name, nodes, generation } => {
            let spinner = output::spinner(json, format!("replicating {name} to {}", nodes.join(", ")));
            let body = crate::api::ReplicateRequest { nodes: nodes.clone(), generation: *generation };
            let path = format!("/v1/goldens/{}/replicate", encode(name));
            let done: Result<Vec<airlock_cluster::replicate::Fetched>> =
                client.call(Method::POST, &path, Some(&body)).await;
            spinner.finish_and_clear();
            let done = done?;
            output::print(json, &done, || output::replicated(&done));
            Ok(0)
        }
        GoldenCommand::Pool { name, size } => {
            let body = crate::api::PoolRequest { size: *size };
            let g: Golden =
                client.call(Method::POST, &format!("/v1/goldens/{}/pool", encode(name)), Some(&body)).await?;
            output::print(json, &g, || {
                format!("golden {} keeps {} started sandboxes ready", g.name, g.pool_size)
            });
            Ok(0)
        }
        GoldenCommand::Ls => {
            let list: Vec<Golden> = client.call(Method::GET, "/v1/goldens", NO_BODY).await?;
            output::print(json, &list, || output::goldens(&list));
            Ok(0)
        }
        GoldenCommand::Show { name } => {
            let g: Golden =
                client.call(Method::GET, &format!("/v1/goldens/{}", encode(name)), NO_BODY).await?;
            output::print(json, &g, || output::golden(&g));
            Ok(0)
        }
        GoldenCommand::Rm { name, force } => {
            let g: Golden = client
                .call(Method::DELETE, &format!("/v1/goldens/{}?force={force}", encode(name)), NO_BODY)
                .await?;
            output::print(json, &g, || format!("deleted golden {}", g.name));
            Ok(0)
        }
    }
}

impl Placement {
    /// The TTL in seconds, labels and name, checked before anything is sent (the
    /// fields of a branch request, and of a fork request besides its golden and access).
    pub(super) fn checked(&self) -> Result<BranchRequest> {
        let ttl_seconds = match &self.ttl {
            Some(t) => Some(validate::parse_ttl(t)?.as_secs().max(1) as i64),
            None => None,
        };
        if let Some(n) = &self.name {
            validate::sandbox_name(n)?;
        }
        Ok(BranchRequest { ttl_seconds, labels: validate::labels(&self.labels)?, name: self.name.clone() })
    }
}
