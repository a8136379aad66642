//! A client of `dormant-server` processes (`binary.rs`): the requests the tests that kill and
//! restart them make, and a wait for the root's status to reach a state.

use std::time::{Duration, Instant};

use reqwest::StatusCode;
use serde_json::Value;

/// A client of servers running as processes.
pub struct Client {
    pub http: reqwest::Client,
}

impl Client {
    pub fn new() -> Self {
        Self {
            http: reqwest::Client::new(),
        }
    }

    pub async fn post(
        &self,
        base: &str,
        path: &str,
        token: Option<&str>,
        body: Value,
    ) -> anyhow::Result<(StatusCode, Value)> {
        let mut request = self.http.post(format!("{base}{path}")).json(&body);
        if let Some(token) = token {
            request = request.bearer_auth(token);
        }
        let response = request.send().await?;
        let status = response.status();
        Ok((status, response.json().await.unwrap_or_default()))
    }

    pub async fn status(&self, base: &str, session: &str, token: &str) -> anyhow::Result<Value> {
        let response = self
            .http
            .get(format!("{base}/status"))
            .query(&[("session_id", session)])
            .bearer_auth(token)
            .send()
            .await?;
        Ok(response.json().await?)
    }

    /// Polls the root's status until `done` holds (the child processes run on their own
    /// clocks: there is no event to wait on from here), for at most 20 s.
    pub async fn until(
        &self,
        base: &str,
        session: &str,
        token: &str,
        what: &str,
        done: impl Fn(&Value) -> bool,
    ) -> anyhow::Result<Value> {
        let started = Instant::now();
        loop {
            let status = self.status(base, session, token).await?;
            if done(&status) {
                return Ok(status);
            }
            anyhow::ensure!(
                started.elapsed() < Duration::from_secs(20),
                "waited 20 s for {what}; last status {status}"
            );
            tokio::time::sleep(Duration::from_millis(25)).await;
        }
    }
}

/// The call of `tool` the status lists as waiting.
pub fn pending_named<'a>(status: &'a Value, tool: &str) -> Option<&'a Value> {
    status["pending"]
        .as_array()?
        .iter()
        .find(|call| call["tool_name"] == tool && call["waiting"] == true)
}
