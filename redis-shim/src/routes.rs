//! The shim's route table: every path it serves, what each endpoint requires (its
//! [`Endpoint`]) and the handler that answers it, all through [`endpoint::serve`]. The
//! one place the paths are routed: the check paths are the wire crate's (the filter
//! posts to them), the admin paths are [`crate::ops::admin`]'s (`redis-shim counters`
//! calls them), the operators' paths are here.

use crate::metrics::CountedEndpoint;
use crate::ops::admin::{self, COUNTERS_RESET, COUNTERS_SHOW, COUNTERS_VARIANTS};
use crate::ops::operator;
use crate::transport::http::endpoint::{
    self, Access, Admitted, Counting, Endpoint, Method, Reply, MAX_BATCH_BODY_BYTES, MAX_BODY_BYTES,
};
use crate::transport::http::{check, check_batch};
use crate::transport::Shim;
use axum::body::Body;
use axum::extract::State;
use axum::http::HeaderMap;
use axum::routing::{on, MethodFilter, MethodRouter};
use axum::Router;
use ratelimit_wire::{CHECK_BATCH_PATH, CHECK_PATH};
use std::future::Future;
use std::sync::Arc;

/// `POST /v1/check`: one request's checks decided.
pub const CHECK: Endpoint = Endpoint {
    path: CHECK_PATH,
    method: Method::Post {
        body_limit: MAX_BODY_BYTES,
    },
    access: Access::Callers,
    counting: Counting::Requests(CountedEndpoint::Check),
};

/// `POST /v1/check-batch`: several requests' checks, each decided on its own.
pub const CHECK_BATCH: Endpoint = Endpoint {
    path: CHECK_BATCH_PATH,
    method: Method::Post {
        body_limit: MAX_BATCH_BODY_BYTES,
    },
    access: Access::Callers,
    counting: Counting::Requests(CountedEndpoint::Check),
};

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
