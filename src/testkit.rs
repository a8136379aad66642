//! Test tooling for stores and agents, one copy for every test of the workspace. Only with
//! the `test-util` feature.
//!
//! - `contract.rs`: [`store_contract`], the checks of what the runtime relies on from a
//!   [`Store`](crate::store::Store), run on every backend (memory, sled, PostgreSQL).
//! - The delegating store, [`DelegatingStore`], lives beside the stores
//!   (`store/delegating.rs`, public here alone): a wrapper whose [`Delegate`] counts, holds up
//!   or fails each call; [`FaultyStore`] is one.
//! - `postgres.rs`: [`PgCluster`], a throwaway PostgreSQL server for a test.
//! - `logs.rs`: [`CapturedLogs`], what a test's code logs (its spans and fields), as text.

mod contract;
mod logs;
mod postgres;
pub mod scenario;

pub use self::contract::{store_contract, ContractError, Reopen, CHECKS};
pub use self::logs::CapturedLogs;
pub use self::postgres::{ClusterError, PgCluster};
// Defined beside the stores, public here alone.
pub use crate::store::delegating::{Call, Delegate, DelegatingStore, Forward};
pub use crate::store::faulty::{Fault, Faults, FaultyStore, InjectedFault};
