//! Deciding a request against the store, each module returning what happened:
//! [`decision`] (one request's checks, all or nothing across cluster slots), [`refund`]
//! (what a request spanning slots gives back when a later slot refuses), [`adjustments`]
//! (the filter's returns and settlements), [`peek`] (counters read without charging),
//! and [`answer`], which makes a decision every service's answer, counted and logged.
//! For Envoy's services: [`rls`] (a `ShouldRateLimit` request planned into checks, from
//! envoyproxy/ratelimit's configuration) and [`rlqs`] (a quota bucket's limit and
//! its share of the rate), without I/O; [`clock`] times both.

pub mod adjustments;
pub mod answer;
pub mod clock;
pub mod decision;
pub mod peek;
pub mod refund;
pub mod regions;
pub mod rlqs;
pub mod rls;
