//! The shim's route table: every path it serves, what each endpoint requires (its
//! [`Endpoint`]) and the handler that answers it, all through [`endpoint::serve`]. The
//! one place a path is defined: the check paths are the wire crate's (the filter posts
//! to them), the operators' and admin paths are here (`redis-shim counters` calls these).

use crate::endpoint::{self, Access, Admitted, Counting, Endpoint, Method, Reply, Shim};
use crate::{admin, check, check_batch, operator};
use axum::body::Body;
use axum::extract::State;
use axum::http::HeaderMap;
use axum::routing::{on, MethodFilter, MethodRouter};
use axum::Router;
use ratelimit_wire::{CHECK_BATCH_PATH, CHECK_PATH, MAX_BATCH};
use std::future::Future;
use std::sync::Arc;

/// Largest check request body accepted: 16 checks with the longest keys fit in 8 KiB.
pub const MAX_BODY_BYTES: usize = 16 * 1024;
/// Largest batch body accepted.
pub const MAX_BATCH_BODY_BYTES: usize = MAX_BATCH * MAX_BODY_BYTES;

/// `POST /v1/check`: one request's checks decided.
pub const CHECK: Endpoint = Endpoint {
    path: CHECK_PATH,
    method: Method::Post {
        body_limit: MAX_BODY_BYTES,
    },
    access: Access::Callers,
    counting: Counting::CheckRequests,
};

/// `POST /v1/check-batch`: several requests' checks, each decided on its own.
pub const CHECK_BATCH: Endpoint = Endpoint {
    path: CHECK_BATCH_PATH,
    method: Method::Post {
        body_limit: MAX_BATCH_BODY_BYTES,
    },
    access: Access::Callers,
    counting: Counting::CheckRequests,
};

/// The admin endpoints take the counters as a check request does.
const fn admin(path: &'static str) -> Endpoint {
    Endpoint {
        path,
        method: Method::Post {
            body_limit: MAX_BODY_BYTES,
        },
        access: Access::Admin,
        counting: Counting::Uncounted,
    }
}

/// `POST /v1/admin/counters/show`: counters' state, charging nothing.
pub const COUNTERS_SHOW: Endpoint = admin("/v1/admin/counters/show");
/// `POST /v1/admin/counters/reset`: counters deleted.
pub const COUNTERS_RESET: Endpoint = admin("/v1/admin/counters/reset");
/// `POST /v1/admin/counters/variants`: the client's counters under other variants of
/// the same rules.
pub const COUNTERS_VARIANTS: Endpoint = admin("/v1/admin/counters/variants");

/// `GET /healthz`: liveness.
pub const HEALTHZ: Endpoint = Endpoint {
    path: "/healthz",
    method: Method::Get,
    access: Access::Open,
    counting: Counting::Uncounted,
};

/// `GET /readyz`: readiness.
pub const READYZ: Endpoint = Endpoint {
    path: "/readyz",
    method: Method::Get,
    access: Access::Operators,
    counting: Counting::Uncounted,
};

/// `GET /metrics`: Prometheus text.
pub const METRICS: Endpoint = Endpoint {
    path: "/metrics",
    method: Method::Get,
    access: Access::Operators,
    counting: Counting::Uncounted,
};

/// Every endpoint, routed to its handler.
pub fn router(shim: Arc<Shim>) -> Router {
    Router::new()
        .route(CHECK.path, route(&CHECK, check::check))
        .route(CHECK_BATCH.path, route(&CHECK_BATCH, check_batch::check_batch))
        .route(COUNTERS_SHOW.path, route(&COUNTERS_SHOW, admin::show))
        .route(COUNTERS_RESET.path, route(&COUNTERS_RESET, admin::reset))
        .route(COUNTERS_VARIANTS.path, route(&COUNTERS_VARIANTS, admin::variants))
        .route(HEALTHZ.path, route(&HEALTHZ, operator::healthz))
        .route(READYZ.path, route(&READYZ, operator::readyz))
        .route(METRICS.path, route(&METRICS, operator::metrics))
        .with_state(shim)
}

/// `endpoint`'s method routed to `handler`, through the template.
fn route<H, F, R>(endpoint: &'static Endpoint, handler: H) -> MethodRouter<Arc<Shim>>
where
    H: FnOnce(Admitted) -> F + Clone + Send + Sync + 'static,
    F: Future<Output = R> + Send + 'static,
    R: Into<Reply> + 'static,
{
    let method = match endpoint.method {
        Method::Get => MethodFilter::GET,
        Method::Post { .. } => MethodFilter::POST,
    };
    on(
        method,
        move |State(shim): State<Arc<Shim>>, headers: HeaderMap, body: Body| {
            endpoint::serve(shim, endpoint, headers, body, handler.clone())
        },
    )
}
