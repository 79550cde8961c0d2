//! The in-flight bound: at most `max_in_flight` requests that read a body (checks, and
//! admin calls) answered at once. Past it, a request is refused at once instead of
//! queued, which keeps latency and memory bounded; Envoy's failure mode decides what a
//! refused check becomes.

use std::sync::Arc;
use tokio::sync::{OwnedSemaphorePermit, Semaphore};

/// What a request refused past the bound is answered.
pub const OVERLOADED: &str = "overloaded: too many checks in flight";

/// The permits of the requests being answered.
pub struct Admission {
    permits: Arc<Semaphore>,
}

impl Admission {
    pub fn new(max_in_flight: usize) -> Admission {
        Admission {
            permits: Arc::new(Semaphore::new(max_in_flight)),
        }
    }

    /// A permit for one request, held until it is answered; none past the bound.
    pub fn try_admit(&self) -> Option<OwnedSemaphorePermit> {
        self.permits.clone().try_acquire_owned().ok()
    }

    /// Adds to `permit` one permit per further request, up to `requests` in all or
    /// until the bound is reached, so a batch counts against the bound request by
    /// request. Returns how many requests `permit` then covers.
    pub fn admit_more(&self, permit: &mut OwnedSemaphorePermit, requests: usize) -> usize {
        while permit.num_permits() < requests {
            let Some(more) = self.try_admit() else {
                break;
            };
            permit.merge(more);
        }
        permit.num_permits()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_batch_takes_what_the_bound_leaves() {
        let admission = Admission::new(3);
        let single = admission.try_admit();
        assert!(single.is_some());
        let mut batch = admission.try_admit().unwrap();
        assert_eq!(admission.admit_more(&mut batch, 5), 2);
        assert!(admission.try_admit().is_none());
        drop(batch);
        assert!(admission.try_admit().is_some());
    }
}
