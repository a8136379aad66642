//! Time: the [`Clock`] trait, the system clock and a manual clock for tests and simulations.
//! (Defined in `dormant-actors`, whose idle and crash windows read it too.)

pub use dormant_actors::{Clock, ManualClock, SystemClock};
