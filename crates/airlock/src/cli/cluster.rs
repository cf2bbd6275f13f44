//! `airlock nodes`, `airlock cluster init`, `airlock cluster token` and `airlock cluster revoke`.

use hyper::Method;

use airlock_listen::client::NO_BODY;

use super::{output, Cli, ClusterCommand};
use airlock_cluster::records::NodeRecord;
use airlock_core::error::Result;

/// `airlock nodes`: the cluster's nodes with their state and load.
pub(super) async fn nodes(cli: &Cli) -> Result<i32> {
    let list: Vec<NodeRecord> = cli.client()?.call(Method::GET, "/v1/nodes", NO_BODY).await?;
    output::print(cli.json, &list, || output::nodes(&list));
    Ok(0)
}

/// `airlock cluster ...`: files of this node's data root, no daemon needed.
pub(super) fn run(cli: &Cli, cmd: &ClusterCommand) -> Result<i32> {
    let dir = cli.layout().cluster();
    match cmd {
        ClusterCommand::Init => {
            let made = airlock_cluster::ca::init(&dir)?;
            output::print(cli.json, &made, || {
                format!(
                    "made the cluster CA: {}\nfingerprint (SHA-256): {}\nissue each node's join token with `airlock cluster token --node NAME --advertise HOST:PORT`",
                    made.ca_cert.display(),
                    made.fingerprint
                )
            });
        }
        ClusterCommand::Token { node, advertise, out } => {
            airlock_core::validate::name("node", node)?;
            let token = airlock_cluster::ca::token(&dir, node, advertise)?;
            match out {
                Some(path) => {
                    write_secret(path, &token)?;
                    let shown = serde_json::json!({ "node": node, "token_file": path });
                    output::print(cli.json, &shown, || {
                        format!("wrote node {node}'s join token to {} (a secret)", path.display())
                    });
                }
                None => output::print(cli.json, &serde_json::json!({ "node": node, "token": token }), || {
                    token.clone()
                }),
            }
        }
        ClusterCommand::Revoke { node } => {
            airlock_core::validate::name("node", node)?;
            let done = airlock_cluster::ca::revoke(&dir, node)?;
            output::print(cli.json, &done, || {
                format!(
                    "revoked {} certificate(s) of node {} (revoked list {}); this node's daemon puts the list in etcd at its next round, and every node refuses them once it has read it",
                    done.certificates.len(),
                    done.node,
                    done.number
                )
            });
        }
    }
    Ok(0)
}

/// Writes a new file only its owner reads.
fn write_secret(path: &std::path::Path, text: &str) -> Result<()> {
    use std::io::Write;
    use std::os::unix::fs::OpenOptionsExt;
    let mut f =
        std::fs::OpenOptions::new().create_new(true).write(true).mode(0o600).open(path).map_err(|e| {
            airlock_core::error::Error::new(
                airlock_core::error::ErrorCode::FileUnreadable,
                format!("{} cannot be made: {e}", path.display()),
                "give a path of a file that does not exist yet",
            )
        })?;
    f.write_all(format!("{text}\n").as_bytes())?;
    Ok(())
}
