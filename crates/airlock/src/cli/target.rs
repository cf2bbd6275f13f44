//! `airlock target`: register, list, show and forget live targets.

use std::io::Read;

use hyper::Method;

use super::output;
use super::{Cli, TargetCommand};
use airlock_core::error::{Error, ErrorCode, Result};
use airlock_listen::client::{encode, NO_BODY};
use airlock_live::target::Target;

pub(super) async fn run(cli: &Cli, cmd: &TargetCommand) -> Result<i32> {
    let json = cli.json;
    let client = cli.client()?;
    match cmd {
        TargetCommand::Add { name, from_url } => {
            airlock_core::validate::name("target", name)?;
            if from_url != "-" {
                return Err(Error::new(
                    ErrorCode::InvalidRequest,
                    "a target's admin DSN is read from standard input only",
                    "pass `--from-url -` and pipe the DSN in: a DSN on the command line is visible to `ps`",
                ));
            }
            let mut dsn = String::new();
            std::io::stdin().read_to_string(&mut dsn)?;
            let body = airlock_live::target::AddTarget { name: name.clone(), dsn: dsn.trim().to_owned() };
            let t: Target = client.call(Method::POST, "/v1/targets", Some(&body)).await?;
            output::print(json, &t, || output::target(&t));
            Ok(0)
        }
        TargetCommand::Ls => {
            let list: Vec<Target> = client.call(Method::GET, "/v1/targets", NO_BODY).await?;
            output::print(json, &list, || output::targets(&list));
            Ok(0)
        }
        TargetCommand::Show { name } => {
            let t: Target =
                client.call(Method::GET, &format!("/v1/targets/{}", encode(name)), NO_BODY).await?;
            output::print(json, &t, || output::target(&t));
            Ok(0)
        }
        TargetCommand::Rm { name } => {
            let t: Target =
                client.call(Method::DELETE, &format!("/v1/targets/{}", encode(name)), NO_BODY).await?;
            output::print(json, &t, || format!("forgot live target {} and its DSN", t.name));
            Ok(0)
        }
    }
}
