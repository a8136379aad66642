//! The cluster: who owns which tree of sessions (`leases`), each session's root
//! (`lineage`), and the calls between nodes (`peer`).

pub mod leases;
pub(crate) mod lineage;
pub mod peer;
