//! `airlock mcp --target`'s calls: each tool call of the session goes to
//! its grant through the daemon's API, and `run_python` runs in an executor
//! on a grant of its own with the last `run_sql` result as a file.

use axum::http::Method;

use super::grants::RUN_PYTHON;
use super::tools::{ToolOutput, RUN_SQL};
use airlock_core::error::Result;
use airlock_listen::client::Client;

/// `airlock mcp --target`'s session: one grant on a live target, minted for
/// the session and revoked at its end, and the last `run_sql` result, which
/// `run_python` gets as a file.
pub struct OnGrant {
    client: Client,
    /// Scrubbed from error texts (it leads to the socket).
    pub(crate) home: String,
    target: String,
    /// What the session's grant was asked for, which each `run_python`'s own
    /// grant is asked for again.
    request: serde_json::Value,
    grant: String,
    last: std::sync::Mutex<Option<serde_json::Value>>,
}

/// How long a `run_python` may run.
const PYTHON_TIMEOUT_SECONDS: u64 = 60;

impl OnGrant {
    /// The session on `grant`, minted on `target` for `request`.
    pub fn new(
        client: Client,
        home: String,
        target: String,
        request: serde_json::Value,
        grant: String,
    ) -> OnGrant {
        OnGrant { client, home, target, request, grant, last: Default::default() }
    }

    pub(crate) async fn call(&self, tool: &str, args: serde_json::Value) -> Result<ToolOutput> {
        if tool == RUN_PYTHON {
            return self.run_python(&args).await;
        }
        let path = format!("/v1/grants/{}/tools/{}", self.grant, airlock_listen::client::encode(tool));
        let out: ToolOutput = self.client.call(Method::POST, &path, Some(&args)).await?;
        if tool == RUN_SQL && !out.is_error {
            *self.last.lock().unwrap_or_else(|p| p.into_inner()) = Some(out.result.clone());
        }
        Ok(out)
    }

    /// Runs the model's code in an executor on a grant of its own (the same
    /// tables and rows; an executor's grant ends with it, the session's must
    /// not), with the last result as `result.csv` and `result.json`.
    async fn run_python(&self, args: &serde_json::Value) -> Result<ToolOutput> {
        let code = match args {
            serde_json::Value::Object(m) if m.len() == 1 => m.get("code").and_then(|c| c.as_str()),
            _ => None,
        };
        let Some(code) = code else {
            return Ok(ToolOutput::refused(&airlock_core::error::Error::new(
                airlock_core::error::ErrorCode::InvalidArguments,
                "run_python takes `code`, a string, and nothing else",
                "call run_python with {\"code\": \"import pandas as pd ...\"}",
            )));
        };
        use base64::Engine as _;
        let encode = |bytes: &[u8]| base64::engine::general_purpose::STANDARD.encode(bytes);
        let mut files =
            vec![serde_json::json!({"path": "code.py", "content_base64": encode(code.as_bytes())})];
        if let Some(last) = self.last.lock().unwrap_or_else(|p| p.into_inner()).clone() {
            files.push(serde_json::json!({"path": "result.json", "content_base64": encode(last.to_string().as_bytes())}));
            files.push(
                serde_json::json!({"path": "result.csv", "content_base64": encode(csv(&last).as_bytes())}),
            );
        }
        let mut request = self.request.clone();
        request["ttl_seconds"] = serde_json::json!(PYTHON_TIMEOUT_SECONDS + 60);
        let path = format!("/v1/targets/{}/grants", airlock_listen::client::encode(&self.target));
        let granted: serde_json::Value = self.client.call(Method::POST, &path, Some(&request)).await?;
        let id = granted["id"].as_str().unwrap_or_default().to_owned();
        drop(granted); // its DSN is not needed here
        let exec = serde_json::json!({
            "argv": ["python3", "code.py"],
            "timeout_seconds": PYTHON_TIMEOUT_SECONDS,
            "files": files,
            "get": ["chart.png"],
        });
        let ran: serde_json::Value =
            self.client.call(Method::POST, &format!("/v1/grants/{id}/exec"), Some(&exec)).await?;
        let (stdout, stderr) = (ran["stdout"].as_str().unwrap_or(""), ran["stderr"].as_str().unwrap_or(""));
        let timed_out = ran["timed_out"] == true;
        let exit = ran["exit_code"].as_i64();
        let chart = ran["files"][0]["content_base64"].as_str().map(str::to_owned);
        let summary = match (timed_out, exit) {
            (true, _) => format!("The code was stopped after {PYTHON_TIMEOUT_SECONDS} s."),
            (false, Some(0)) => "The code ran to its end.".to_owned(),
            (false, Some(code)) => format!("The code failed (exit code {code}); its stderr says why."),
            (false, None) => "The code was killed.".to_owned(),
        };
        let data = serde_json::json!({"stdout": stdout, "stderr": stderr, "chart": chart.is_some()});
        let mut result = serde_json::json!({"exit_code": exit, "timed_out": timed_out, "stdout": stdout, "stderr": stderr});
        if let Some(png) = chart {
            result["chart_png_base64"] = serde_json::json!(png);
        }
        Ok(ToolOutput {
            is_error: timed_out || exit != Some(0),
            result,
            text: super::envelope::wrap(&summary, &data.to_string()),
        })
    }
}

/// A `run_sql` result as CSV: its columns' names, then its rows.
fn csv(result: &serde_json::Value) -> String {
    let field = |v: &serde_json::Value| {
        let text = match v {
            serde_json::Value::Null => String::new(),
            serde_json::Value::String(s) => s.clone(),
            other => other.to_string(),
        };
        if text.contains([',', '"', '\n', '\r']) {
            format!("\"{}\"", text.replace('"', "\"\""))
        } else {
            text
        }
    };
    let mut out = String::new();
    let names: Vec<String> = result["columns"]
        .as_array()
        .map(|c| c.iter().map(|c| field(&c["name"])).collect())
        .unwrap_or_default();
    out.push_str(&names.join(","));
    out.push('\n');
    for row in result["rows"].as_array().into_iter().flatten() {
        let cells: Vec<String> = row.as_array().map(|r| r.iter().map(field).collect()).unwrap_or_default();
        out.push_str(&cells.join(","));
        out.push('\n');
    }
    out
}
