//! The operators' endpoints: liveness (`GET /healthz`), readiness (`GET /readyz`) and
//! the Prometheus metrics (`GET /metrics`).

use crate::store::StoreAdmin;
use crate::transport::http::endpoint::{error, Admitted};
use axum::http::{header, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::Json;
use serde_json::json;
use std::sync::atomic::Ordering;

/// Liveness: 200 while the process serves, whatever Redis does (restarting the shim
/// would not bring Redis back).
pub async fn healthz(_request: Admitted) -> Response {
    (StatusCode::OK, Json(json!({ "status": "ok" }))).into_response()
}

/// Readiness: 200 when Redis answers PING within the timeout and the shim is not
/// shutting down, 503 otherwise.
pub async fn readyz(request: Admitted) -> Response {
    let shim = &request.shim;
    if shim.draining.load(Ordering::SeqCst) {
        return error(StatusCode::SERVICE_UNAVAILABLE, "shutting down");
    }
    match shim.store.ping().await {
        Ok(()) => (
            StatusCode::OK,
            Json(json!({ "status": "ready", "redis": "reachable" })),
        )
            .into_response(),
        Err(e) => {
            shim.metrics.redis_error(e.kind());
            error(StatusCode::SERVICE_UNAVAILABLE, format!("redis unreachable: {e}"))
        }
    }
}

pub async fn metrics(request: Admitted) -> Response {
    let mut text = request.shim.metrics.render();
    if let Some(regions) = &request.shim.regions {
        regions.render(&mut text);
    }
    (
        [(header::CONTENT_TYPE, "text/plain; version=0.0.4; charset=utf-8")],
        text,
    )
        .into_response()
}
