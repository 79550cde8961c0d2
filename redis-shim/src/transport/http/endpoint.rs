//! The one template every endpoint goes through ([`crate::routes`] lists them). An
//! [`Endpoint`] says what it requires; [`serve`] enforces it, in this order, before the
//! endpoint's handler sees the request:
//!
//! 1. the caller's token, checked before anything else, so a caller without it costs no
//!    permit and none of its body is read;
//! 2. for an endpoint that takes a body, an in-flight permit (`transport/admission.rs`),
//!    held until the request is answered;
//! 3. then the body, read within the endpoint's size limit and the body timeout while
//!    the permit is held (so the bytes buffered at once stay under the bound times the
//!    limit); a body that stalls is answered 408, its connection closed and counted.
//!
//! Whatever the answer, the endpoint's [`Counting`] says how it enters the metrics.
//! Handlers only say what they answered: the refusals above, their status codes and
//! their counting are the template's alone.

use super::body::{read_body, BodyError};
use crate::metrics::{ConnectionClose, CountedEndpoint, RequestOutcome};
use crate::transport::admission::OVERLOADED;
use crate::transport::config::ShimConfig;
use crate::transport::shim::{constant_time_eq, Shim};
use axum::body::{Body, Bytes};
use axum::http::{header, HeaderMap, HeaderValue, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::Json;
use ratelimit_wire::{MAX_BATCH, TOKEN_HEADER, VERSION, VERSION_HEADER};
use serde_json::json;
use std::future::Future;
use std::sync::Arc;
use std::time::Instant;
use tokio::sync::OwnedSemaphorePermit;

/// Largest check request body accepted: 16 checks with the longest keys fit in 8 KiB.
pub const MAX_BODY_BYTES: usize = 16 * 1024;
/// Largest batch body accepted.
pub const MAX_BATCH_BODY_BYTES: usize = MAX_BATCH * MAX_BODY_BYTES;

/// An endpoint's path and what it requires before its handler runs.
#[derive(Debug, Clone, Copy)]
pub struct Endpoint {
    pub path: &'static str,
    pub method: Method,
    pub access: Access,
    pub counting: Counting,
}

/// How an endpoint is called.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Method {
    /// No body is read and no in-flight permit taken: the operators' probes and scrapes,
    /// which must answer while checks fill the bound.
    Get,
    /// A JSON body of at most `body_limit` bytes, read under an in-flight permit.
    Post { body_limit: usize },
}

/// Who may call an endpoint: which token it requires in `x-ratelimit-token`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Access {
    /// Anyone (liveness: a probe must not need a secret).
    Open,
    /// The shared token, when the shim has one and runs with `--token-for-operators`.
    Operators,
    /// The shared token, when the shim has one.
    Callers,
    /// The admin token, else the shared token; with neither, nobody (403): these
    /// endpoints read and reset any client's counters, so they are never open.
    Admin,
}

/// How an endpoint's answers enter the metrics.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Counting {
    /// Each request answered is counted by outcome under this endpoint in
    /// `rlshim_requests_total` (a check request also timed in
    /// `rlshim_check_duration_seconds`); a refusal by the template counts once. Refusals
    /// count too, so a caller with the wrong token or past the bound shows.
    Requests(CountedEndpoint),
    /// Not in `rlshim_requests_total` (the operators' probes and scrapes, which take no
    /// permit); a body that stalls still counts as a connection closed, as every
    /// endpoint's does.
    Uncounted,
}

/// A request that passed its endpoint's requirements, as its handler gets it.
pub struct Admitted {
    pub shim: Arc<Shim>,
    /// The whole body (empty for a GET endpoint).
    pub body: Bytes,
    /// The version the caller stated in the `x-ratelimit-wire` header, if any.
    pub stated_version: Option<HeaderValue>,
    /// Private, so a handler cannot drop it early: the request holds it until answered.
    permit: Option<OwnedSemaphorePermit>,
}

impl Admitted {
    /// Extends the request's permit to cover `requests` requests (a batch counts against
    /// the bound request by request), as far as the bound allows; how many it covers.
    pub fn admit_more(&mut self, requests: usize) -> usize {
        match &mut self.permit {
            Some(permit) => self.shim.admission.admit_more(permit, requests),
            // A GET endpoint takes no permit, so it admits none either.
            None => 0,
        }
    }
}

/// What a handler answers: the response, and the outcome of each request it answered
/// (for endpoints that count them). A handler that counts nothing answers a plain
/// [`Response`].
pub struct Reply {
    pub response: Response,
    pub outcomes: Vec<RequestOutcome>,
}

impl Reply {
    /// A response that answered check requests with these outcomes.
    pub fn counted(response: Response, outcomes: Vec<RequestOutcome>) -> Reply {
        Reply { response, outcomes }
    }
}

impl From<Response> for Reply {
    fn from(response: Response) -> Reply {
        Reply {
            response,
            outcomes: Vec::new(),
        }
    }
}

/// Why a request, or one check request of a batch, was not answered as asked: how it is
/// counted, the HTTP status, and the message.
pub struct Refusal {
    pub outcome: RequestOutcome,
    pub status: StatusCode,
    pub message: String,
    /// The body was left unread: the connection is closed after the answer rather than
    /// drained for a next request.
    close: bool,
}

impl Refusal {
    pub fn new(outcome: RequestOutcome, status: StatusCode, message: impl Into<String>) -> Refusal {
        Refusal {
            outcome,
            status,
            message: message.into(),
            close: false,
        }
    }

    fn closing(self) -> Refusal {
        Refusal { close: true, ..self }
    }

    pub fn into_response(self) -> Response {
        let mut response = error(self.status, self.message);
        if self.close {
            response
                .headers_mut()
                .insert(header::CONNECTION, HeaderValue::from_static("close"));
        }
        response
    }
}

/// An error answer: `{"error": message}`.
pub fn error(status: StatusCode, message: impl Into<String>) -> Response {
    (status, Json(json!({ "error": message.into() }))).into_response()
}

/// Answers one request to `endpoint`: its requirements, then `handler`, then its
/// counting (see the module's documentation).
pub async fn serve<H, F, R>(
    shim: Arc<Shim>,
    endpoint: &Endpoint,
    headers: HeaderMap,
    body: Body,
    handler: H,
) -> Response
where
    H: FnOnce(Admitted) -> F,
    F: Future<Output = R>,
    R: Into<Reply>,
{
    let started = Instant::now();
    let reply = match admit(&shim, endpoint, &headers, body).await {
        Ok(admitted) => handler(admitted).await.into(),
        Err(refusal) => {
            let outcome = refusal.outcome;
            Reply::counted(refusal.into_response(), vec![outcome])
        }
    };
    if let Counting::Requests(counted) = endpoint.counting {
        let elapsed = started.elapsed();
        for outcome in reply.outcomes {
            shim.metrics.request(counted, outcome, elapsed);
        }
    }
    // Every answer says which release answered it, so that a filter can tell.
    let mut response = reply.response;
    response
        .headers_mut()
        .insert(VERSION_HEADER, HeaderValue::from_static(VERSION));
    response
}

/// The request, once it has passed `endpoint`'s requirements; or why not.
async fn admit(
    shim: &Arc<Shim>,
    endpoint: &Endpoint,
    headers: &HeaderMap,
    body: Body,
) -> Result<Admitted, Refusal> {
    let body_limit = match endpoint.method {
        Method::Get => None,
        Method::Post { body_limit } => Some(body_limit),
    };
    if let Some(refusal) = access_refusal(&shim.config, endpoint.access, headers) {
        return Err(match body_limit {
            Some(_) => refusal.closing(),
            None => refusal,
        });
    }
    let Some(body_limit) = body_limit else {
        return Ok(Admitted {
            shim: shim.clone(),
            body: Bytes::new(),
            stated_version: None,
            permit: None,
        });
    };
    let Some(permit) = shim.admission.try_admit() else {
        return Err(Refusal::new(
            RequestOutcome::Overloaded,
            StatusCode::SERVICE_UNAVAILABLE,
            OVERLOADED,
        ));
    };
    let timeout = shim.config.body_timeout;
    let body = match read_body(headers, body, body_limit, timeout).await {
        Ok(body) => body,
        Err(BodyError::TooLarge) => {
            return Err(Refusal::new(
                RequestOutcome::Invalid,
                StatusCode::PAYLOAD_TOO_LARGE,
                format!("body over {body_limit} bytes"),
            ))
        }
        Err(BodyError::TimedOut) => {
            shim.metrics.connection_closed(ConnectionClose::BodyTimeout);
            return Err(Refusal::new(
                RequestOutcome::Invalid,
                StatusCode::REQUEST_TIMEOUT,
                format!("body not received within {} ms", timeout.as_millis()),
            )
            .closing());
        }
        Err(BodyError::Unreadable(e)) => {
            return Err(Refusal::new(
                RequestOutcome::Invalid,
                StatusCode::BAD_REQUEST,
                format!("body unreadable: {e}"),
            )
            .closing())
        }
    };
    Ok(Admitted {
        shim: shim.clone(),
        body,
        stated_version: headers.get(VERSION_HEADER).cloned(),
        permit: Some(permit),
    })
}

/// Why a caller with these headers may not call an endpoint of `access`, if it may not.
fn access_refusal(config: &ShimConfig, access: Access, headers: &HeaderMap) -> Option<Refusal> {
    let required = match access {
        Access::Open => None,
        Access::Operators => config.token.as_ref().filter(|_| config.token_for_operators),
        Access::Callers => config.token.as_ref(),
        Access::Admin => match config.admin_token.as_ref().or(config.token.as_ref()) {
            Some(token) => Some(token),
            None => {
                return Some(Refusal::new(
                    RequestOutcome::Unauthorized,
                    StatusCode::FORBIDDEN,
                    "the admin endpoints are off: this shim has no token (start it with --admin-token or --token)",
                ))
            }
        },
    }?;
    let presented = headers
        .get(TOKEN_HEADER)
        .map(|v| v.as_bytes())
        .unwrap_or_default();
    (!constant_time_eq(presented, required.as_bytes())).then(|| {
        Refusal::new(
            RequestOutcome::Unauthorized,
            StatusCode::UNAUTHORIZED,
            format!("missing or wrong {TOKEN_HEADER}"),
        )
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::transport::config::test_config;

    fn config(token: Option<&str>, admin_token: Option<&str>, token_for_operators: bool) -> ShimConfig {
        ShimConfig {
            token: token.map(String::from),
            admin_token: admin_token.map(String::from),
            token_for_operators,
            ..test_config()
        }
    }

    /// The status each access answers a caller presenting `presented`, 200 if admitted.
    fn statuses(config: &ShimConfig, presented: Option<&str>) -> [u16; 4] {
        let mut headers = HeaderMap::new();
        if let Some(token) = presented {
            headers.insert(TOKEN_HEADER, token.parse().unwrap());
        }
        [Access::Open, Access::Operators, Access::Callers, Access::Admin].map(|access| {
            access_refusal(config, access, &headers).map_or(200, |refusal| refusal.status.as_u16())
        })
    }

    #[test]
    fn each_access_requires_its_token() {
        // [open, operators, callers, admin]
        let open = config(None, None, false);
        assert_eq!(statuses(&open, None), [200, 200, 200, 403]);
        let shared = config(Some("t"), None, false);
        assert_eq!(statuses(&shared, None), [200, 200, 401, 401]);
        assert_eq!(statuses(&shared, Some("t")), [200, 200, 200, 200]);
        let guarded = config(Some("t"), None, true);
        assert_eq!(statuses(&guarded, Some("wrong")), [200, 401, 401, 401]);
        assert_eq!(statuses(&guarded, Some("t")), [200, 200, 200, 200]);
        let separate = config(Some("t"), Some("admin"), false);
        assert_eq!(statuses(&separate, Some("t")), [200, 200, 200, 401]);
        assert_eq!(statuses(&separate, Some("admin")), [200, 200, 401, 200]);
        // An admin token alone guards the admin endpoints only.
        let admin_only = config(None, Some("admin"), true);
        assert_eq!(statuses(&admin_only, None), [200, 200, 200, 401]);
    }
}
