//! `envoy.service.rate_limit_quota.v3.RateLimitQuotaService/StreamRateLimitQuotas`: the
//! caller's token (gRPC metadata `x-ratelimit-token`, as for the rate-limit service), a
//! bound on open streams, then each stream served by a task of its own: every usage
//! report answered at once ([`Session::handle`]) and its admissions charged after, and
//! pushes from other streams' re-balances sent between. When the stream ends (the Envoy
//! went away, or closed it), its shares go to the other Envoys of its pools once its
//! assignments can no longer be spent.

use super::presented_token;
use super::rlqs_pools::Pools;
use super::rlqs_session::Session;
use crate::envoy_api::messages::quota::{RateLimitQuotaResponse, RateLimitQuotaUsageReports};
use crate::transport::grpc::reload::LiveConfig;
use crate::transport::shim::Shim;
use ratelimit_wire::TOKEN_HEADER;
use std::sync::Arc;
use tokio::sync::{mpsc, watch};
use tokio_stream::wrappers::ReceiverStream;
use tonic::{Request, Response, Status, Streaming};

/// At most this many streams open at once (each holds its buckets' accounts).
pub const MAX_STREAMS: usize = 4096;

pub struct RlqsService {
    shim: Arc<Shim>,
    config: Arc<LiveConfig>,
    pools: Arc<Pools>,
    stop: watch::Receiver<bool>,
}

impl RlqsService {
    pub fn new(shim: Arc<Shim>, config: Arc<LiveConfig>, stop: watch::Receiver<bool>) -> RlqsService {
        RlqsService {
            shim,
            config,
            pools: Arc::default(),
            stop,
        }
    }
}

/// Holds one of the bounded stream places (counted in the metrics) while a stream lives.
struct OpenStream {
    shim: Arc<Shim>,
}

impl Drop for OpenStream {
    fn drop(&mut self) {
        self.shim.metrics.rlqs.stream_closed();
    }
}

/// The answers of one quota stream, in order.
pub type QuotaStream = ReceiverStream<Result<RateLimitQuotaResponse, Status>>;

impl RlqsService {
    pub async fn stream_rate_limit_quotas(
        &self,
        request: Request<Streaming<RateLimitQuotaUsageReports>>,
    ) -> Result<Response<QuotaStream>, Status> {
        let metrics = &self.shim.metrics.rlqs;
        if !self.shim.accepts_token(presented_token(request.metadata())) {
            return Err(Status::unauthenticated(format!(
                "missing or wrong {TOKEN_HEADER}"
            )));
        }
        if !metrics.open_stream(MAX_STREAMS) {
            return Err(Status::resource_exhausted(format!(
                "more than {MAX_STREAMS} quota streams open"
            )));
        }
        let place = OpenStream {
            shim: self.shim.clone(),
        };
        let (answers, outbound) = mpsc::channel(4);
        let session = Session::new(
            self.shim.clone(),
            self.config.clone(),
            self.pools.clone(),
            answers.clone(),
        );
        tokio::spawn(serve(
            session,
            request.into_inner(),
            answers,
            self.stop.clone(),
            place,
        ));
        Ok(Response::new(ReceiverStream::new(outbound)))
    }
}

/// Answers the stream's reports in order until it ends, then releases its shares.
async fn serve(
    mut session: Session,
    mut reports: Streaming<RateLimitQuotaUsageReports>,
    answers: mpsc::Sender<Result<RateLimitQuotaResponse, Status>>,
    mut stop: watch::Receiver<bool>,
    place: OpenStream,
) {
    loop {
        let report = tokio::select! {
            report = reports.message() => report,
            _ = answers.closed() => break,
            _ = stop.wait_for(|stopped| *stopped) => {
                drop(session.end());
                drop(place);
                return;
            }
        };
        match report {
            Ok(Some(report)) => match session.handle(report) {
                Ok((answer, charges)) => {
                    if !answer.bucket_action.is_empty() && answers.send(Ok(answer)).await.is_err() {
                        break;
                    }
                    session.charge(&charges).await;
                }
                Err(status) => {
                    tracing::warn!(%status, "RLQS: a stream's report refused; the stream ends");
                    let _ = answers.send(Err(status)).await;
                    break;
                }
            },
            Ok(None) => break,
            Err(status) => {
                tracing::debug!(%status, "RLQS: a stream broke");
                break;
            }
        }
    }
    drop(answers);
    drop(place);
    session.end().release().await;
}
