//! The conformance scenarios whose agents marked `"remote": true` live on a second runtime,
//! served by a dormant server on a loopback port (`tests/scenarios/remote/`): the scenario
//! runner has no HTTP server of its own, so this crate hosts the remote side.

use std::path::PathBuf;
use std::sync::Arc;

use dormant::llm::BoxFuture;
use dormant::remote::RemoteAgents;
use dormant::testkit::scenario::{self, RemoteHost, Served};
use dormant::Runtime;
use dormant_server::{Auth, HttpRemoteAgents, Server};

const KEY: &str = "scenario-remote-operator-key";

/// Serves each remote runtime with an authenticate hook that lets the parent in as an
/// operator.
#[derive(Debug)]
struct HttpHost {
    transport: Arc<HttpRemoteAgents>,
}

impl RemoteHost for HttpHost {
    fn serve(&self, runtime: Runtime, port: u16) -> BoxFuture<'static, Result<Served, String>> {
        Box::pin(async move {
            let auth = Auth::api_key(KEY);
            let server = Server::new(runtime, auth);
            let closing = server.closing();
            let app = server.router().map_err(|error| error.to_string())?;
            let listener = tokio::net::TcpListener::bind(("127.0.0.1", port))
                .await
                .map_err(|error| format!("cannot listen on port {port}: {error}"))?;
            let port = listener
                .local_addr()
                .map_err(|error| error.to_string())?
                .port();
            let stop = closing.clone();
            let served = tokio::spawn(async move {
                let _ = axum::serve(listener, app)
                    .with_graceful_shutdown(async move { stop.closed().await })
                    .await;
            });
            Ok(Served {
                endpoint: format!("http://127.0.0.1:{port}"),
                port,
                stop: Box::new(move || {
                    Box::pin(async move {
                        closing.close();
                        let _ = served.await;
                    })
                }),
            })
        })
    }

    fn transport(&self) -> Arc<dyn RemoteAgents> {
        self.transport.clone()
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn remote_scenarios_hold() {
    let dir = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../tests/scenarios/remote");
    let host = Arc::new(HttpHost {
        transport: Arc::new(HttpRemoteAgents::new(Some(KEY.into()))),
    });
    let summary = scenario::run_paths_with(&[dir], host).await;
    for line in summary.failure_lines() {
        println!("{line}");
    }
    println!("{summary}");
    assert!(
        summary.all_passed(),
        "{}",
        summary.failure_lines().join("\n")
    );
    assert!(summary.passed() >= 8, "the suite lost files: {summary}");
}
