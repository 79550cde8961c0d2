//! One request's checks sent where their rung says (docs/REGIONS.md), as a [`Store`]
//! that [`crate::decide::decision::decide`] decides all or nothing over, each target a
//! group the way a cluster slot is one: a `home` check goes to its home region's Redis,
//! every other check to this region's, where check_regions.lua decides the replicated
//! ones. Home regions come first and this region last, so when a home refuses, nothing
//! here is charged, and when this region refuses, only home charges are given back
//! (never a replicated one, which refund.lua does not know).

use crate::store::redis_store::RedisStore;
use crate::store::regions::{Home, Regions};
use crate::store::scripts::{
    mode_arg, params_arg, parse_rows, Charge, FunctionCall, Mode, RequestChecks, Row,
};
use crate::store::{Answer, SharedScript, Store, StoreError};
use ratelimit_wire::{Check, Regions as Rung};

/// One request's checks, each with the region that counts it.
pub struct Routed<'a> {
    local: &'a RedisStore,
    regions: &'a Regions,
    /// Per Redis key of the request, where it lives.
    homes: Vec<(&'a str, Home)>,
}

impl<'a> Routed<'a> {
    pub fn new(
        local: &'a RedisStore,
        regions: &'a Regions,
        keys: &'a [String],
        checks: &[Check],
    ) -> Routed<'a> {
        let homes = keys
            .iter()
            .zip(checks)
            .map(|(key, check)| {
                let home = match check.regions {
                    Rung::Home => regions.home_of(&check.key),
                    Rung::Independent | Rung::Replicated => Home::Here,
                };
                (key.as_str(), home)
            })
            .collect();
        Routed {
            local,
            regions,
            homes,
        }
    }

    fn home(&self, key: &str) -> Home {
        self.homes
            .iter()
            .find(|(known, _)| *known == key)
            .map_or(Home::Here, |(_, home)| *home)
    }

    /// check_regions.lua over checks of this region, some of them replicated.
    async fn check_here(&self, mode: Mode, keys: &[&str], checks: &[&Check]) -> Result<Vec<Row>, StoreError> {
        let confirmed = self.regions.confirmed();
        let mut call = FunctionCall::new(&self.local.library().check_regions);
        call.arg(mode_arg(mode))
            .arg(self.regions.own.as_str())
            .arg(self.regions.names_arg())
            .arg(self.regions.rank())
            .arg(confirmed.as_str())
            .arg(self.regions.renew_ms());
        for (key, check) in keys.iter().zip(checks) {
            let rung = if check.regions == Rung::Replicated {
                "r"
            } else {
                "i"
            };
            call.key(key).arg(rung).arg(params_arg(check));
        }
        call.key(self.regions.stream_key());
        let reply: Vec<i64> = self.local.call_function(&call).await?;
        parse_rows(reply, keys.len()).map_err(|e| StoreError::Malformed(e.0))
    }
}

impl Store for Routed<'_> {
    /// Per home region, in the peers' order, then this region's.
    fn group_by_slot(&self, keys: &[String]) -> Vec<Vec<usize>> {
        let mut groups: Vec<(usize, Vec<usize>)> = Vec::new();
        for (index, key) in keys.iter().enumerate() {
            let order = match self.home(key) {
                Home::Peer(peer) => peer,
                Home::Here => usize::MAX,
            };
            match groups.iter_mut().find(|(known, _)| *known == order) {
                Some((_, members)) => members.push(index),
                None => groups.push((order, vec![index])),
            }
        }
        groups.sort_by_key(|(order, _)| *order);
        groups.into_iter().map(|(_, members)| members).collect()
    }

    async fn check(&self, mode: Mode, keys: &[&str], checks: &[&Check]) -> Result<Vec<Row>, StoreError> {
        let Some(first) = keys.first() else {
            return Ok(Vec::new());
        };
        match self.home(first) {
            Home::Peer(peer) => self.regions.peers[peer].store.check(mode, keys, checks).await,
            Home::Here if checks.iter().any(|check| check.regions == Rung::Replicated) => {
                self.check_here(mode, keys, checks).await
            }
            Home::Here => self.local.check(mode, keys, checks).await,
        }
    }

    async fn refund(&self, charges: &[Charge<'_>]) -> Result<Vec<Row>, StoreError> {
        let Some(first) = charges.first() else {
            return Ok(Vec::new());
        };
        match self.home(first.key) {
            Home::Peer(peer) => self.regions.peers[peer].store.refund(charges).await,
            // This region's group is decided last: nothing of it is ever given back.
            Home::Here => Err(StoreError::Unsupported(
                "a charge of this region's group is never given back".into(),
            )),
        }
    }

    fn shared_script(&self, _keys: &[String]) -> Option<SharedScript> {
        None
    }

    async fn check_requests(&self, _script: SharedScript, _requests: &[RequestChecks<'_>]) -> Answer {
        Err(StoreError::Unsupported(
            "a request with home or replicated checks is decided alone".into(),
        ))
    }
}
