//! The cluster: who owns which tree of sessions (`leases`), each session's root
//! (`lineage`), and the calls between nodes (`peer`).
//!
//! Public as the implementer's room of a cluster: [`leases`], the [`Leases`](leases::Leases)
//! trait (who owns which tree; `PgStore` is one, [`SingleNode`](leases::SingleNode) the store
//! one process uses alone) and what it speaks. At `cluster::leases`, the path the README
//! documents.

pub mod leases;
pub(crate) mod lineage;
// The calls between nodes (`PeerCall`, `PeerAnswer`, the `Peers` transport, `SubmitResumed`)
// are dormant-server's plumbing: its `HttpPeers` implements `Peers`, its `POST /peer` routes
// serve `PeerCall`s, and a daemon only hands `HttpPeers` to `RuntimeBuilder::peers`. Public
// so that crate can name them (and this crate's tests fake a transport), hidden from the docs
// because no daemon author writes or reads them; they change with the server.
#[doc(hidden)]
pub mod peer;
