//! `airlock golden`: create, refresh, promote, prune, remove and pools.

use std::io::Read;
use std::path::PathBuf;

use hyper::Method;

use super::commands::NO_BODY;
use super::output;
use super::{Cli, GoldenCommand, Placement};
use airlock_core::error::{Error, ErrorCode, Result};
use airlock_core::validate;
use airlock_lifecycle::golden::{CreateGolden, Golden};
use airlock_lifecycle::sandbox::BranchRequest;
use airlock_listen::client::encode;

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
            let from_url = match from_url.as_deref() {
                Some("-") => {
                    let mut text = String::new();
                    std::io::stdin().read_to_string(&mut text)?;
                    Some(text.trim().to_owned())
                }
                Some(dsn) => {
                    let from_env = std::env::var("AIRLOCK_FROM_URL").ok().as_deref() == Some(dsn);
                    if !from_env && airlock_core::dsn::password(dsn).is_some() {
                        eprintln!(
                            "warning: a password on the command line is visible to `ps` while this runs; \
                             use `--from-url -` (DSN on stdin) or AIRLOCK_FROM_URL instead"
                        );
                    }
                    Some(dsn.to_owned())
                }
                None => None,
            };
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
