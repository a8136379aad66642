//! Test tooling for stores and agents: the store contract suite every backend passes
//! ([`store_contract`]). Only with the `test-util` feature.
//!
//! - `contract.rs`: [`store_contract`], the checks of what the runtime relies on from a
//!   [`Store`](crate::store::Store), run on any backend.

mod contract;

pub use self::contract::{store_contract, ContractError, Reopen, CHECKS};
