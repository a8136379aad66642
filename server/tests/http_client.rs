//! One `HttpClient` shared by the remote sub-agents' transport and the cluster's: one pool of
//! connections between them.

use std::sync::Arc;

use dormant::cluster::leases::{LeaseOwner, PeerKey};
use dormant::cluster::peer::{PeerCall, Peers};
use dormant::remote::RemoteAgents;
use dormant::{SessionId, SledStore};
use dormant_server::{Auth, HttpClient, HttpPeers, HttpRemoteAgents, Server};

mod common;

#[tokio::test]
async fn remote_agents_and_peers_on_one_client_share_its_connections() -> anyhow::Result<()> {
    let runtime = common::demo_runtime(Arc::new(SledStore::temporary()?))?;
    let app = Server::new(runtime, Auth::api_key("a-key-of-at-least-16-characters")).router()?;
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await?;
    let endpoint = format!("http://{}", listener.local_addr()?);
    let served = dormant_server::serve(listener, app);
    let connections = served.connections();
    let server = tokio::spawn(async move { served.await });

    let client = HttpClient::new();
    let remote = HttpRemoteAgents::with_client(client.clone(), Some("wrong-key".into()));
    let peers = HttpPeers::with_client(client);
    let session = SessionId::generate();
    // Both are refused (a wrong key each): only the connections they went over matter here.
    let refused = remote.status(&endpoint, &session, 0).await;
    anyhow::ensure!(
        refused.is_err(),
        "the remote status was refused: {refused:?}"
    );
    let owner = LeaseOwner {
        node: "other".into(),
        address: Some(endpoint.clone()),
        key: Some(PeerKey::new("not-the-node-key")),
    };
    let refused = peers.call(&owner, &PeerCall::IsSettled { session }).await;
    anyhow::ensure!(refused.is_err(), "the peer call was refused: {refused:?}");

    // The second call went over the first one's connection, kept in the shared pool.
    assert_eq!(connections.accepted(), 1);
    server.abort();
    Ok(())
}
